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

func TestOnce(t *testing.T) {
	withDevice := func() []string { return []string{"DEBUG_ECHO_DESCRIPTION=foo0"} }
	without := func() []string { return []string{"PATH=/bin"} }
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// An address nobody can listen on: returning nil proves Once did not
	// serve.
	if err := Run(ctx, Config{Once: true, Listen: "256.0.0.1:1", Prefixes: []string{"DEBUG_ECHO_"}, Logger: testr.New(t), Environ: withDevice}); err != nil {
		t.Fatalf("with a device: %v", err)
	}
	if err := Run(ctx, Config{Once: true, Prefixes: []string{"DEBUG_ECHO_"}, Logger: testr.New(t), Environ: without}); err == nil {
		t.Fatal("without a device: no error")
	}
}
