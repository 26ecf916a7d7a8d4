package link

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dowse-dev/dowse/internal/link/pki"
)

// TestWebSocketNotSentLowat: the hub's WebSocket sockets keep at most
// NotSentLowat bytes unsent in the kernel (TCP_NOTSENT_LOWAT), so that
// what goes next is the link writer's choice.
func TestWebSocketNotSentLowat(t *testing.T) {
	ca, err := pki.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ca.IssueNode("edge", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ListenWebSocket("127.0.0.1:0", pki.ServerTLSConfig(pki.Static[*tls.ClientHelloInfo](srv), ca.Pool()), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	got := make(chan int, 1)
	go func() {
		_ = l.Serve(ctx, func(c Conn) {
			v := -1
			if ws, ok := c.(*wsServerConn); ok && ws.rc != nil {
				_ = ws.rc.Control(func(fd uintptr) {
					v, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT)
				})
			}
			got <- v
			<-ctx.Done()
		})
	}()
	d := &WebSocketDialer{Addr: l.Addr().String(), TLS: pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](cli), ca.Pool(), "127.0.0.1")}
	c, err := d.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case v := <-got:
		if v != NotSentLowat {
			t.Fatalf("the hub's socket has TCP_NOTSENT_LOWAT %d, want %d", v, NotSentLowat)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no connection reached the hub")
	}
}
