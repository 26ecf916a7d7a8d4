package debugecho

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
)

func TestServesDeviceEnvironment(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Listen: addr, Prefixes: []string{"DEBUG_ECHO_", "GREETING"}, Logger: testr.New(t),
			Environ: func() []string {
				return []string{"DEBUG_ECHO_DESCRIPTION=foo0", "DEBUG_ECHO_DESCRIPTION_ABC=foo0", "GREETING=hello", "PATH=/bin", "broken"}
			}})
	}()
	var reply Reply
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&reply)
			resp.Body.Close()
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	want := map[string]string{"DEBUG_ECHO_DESCRIPTION": "foo0", "DEBUG_ECHO_DESCRIPTION_ABC": "foo0", "GREETING": "hello"}
	if fmt.Sprint(reply.Device) != fmt.Sprint(want) {
		t.Fatalf("device %v, want %v", reply.Device, want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
