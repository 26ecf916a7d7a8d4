package link_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/link/pki"
)

func gateTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	ca, err := pki.NewCA("gate-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.IssueNode("edge", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return pki.ServerTLSConfig(pki.Static[*tls.ClientHelloInfo](srv), ca.Pool()),
		pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](node), ca.Pool(), "127.0.0.1")
}

// serve runs l until the test ends; handed-over connections stay open.
func serve(t *testing.T, l link.Listener) <-chan link.Conn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	got := make(chan link.Conn, 16)
	go func() {
		done <- l.Serve(ctx, func(c link.Conn) {
			got <- c
			<-ctx.Done()
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return got
}

// Connections that never finish their TLS handshake hold at most
// maxHandshakes slots; while they do, nobody else gets in; a handed-over
// connection holds none.
func TestWebSocketHandshakesBounded(t *testing.T) {
	serverTLS, clientTLS := gateTLS(t)
	l, err := link.ListenWebSocket("127.0.0.1:0", serverTLS, link.ListenOptions{MaxHandshakes: 2})
	if err != nil {
		t.Fatal(err)
	}
	got := serve(t, l)
	var stalled []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		stalled = append(stalled, c)
	}
	time.Sleep(100 * time.Millisecond) // both accepted, both in their handshake
	d := &link.WebSocketDialer{Addr: l.Addr().String(), TLS: clientTLS}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	if c, err := d.Dial(ctx); err == nil {
		c.Close()
		t.Fatal("an edge got in while two stalled handshakes held both slots")
	}
	cancel()

	_ = stalled[0].Close() // frees a slot
	// The second edge needs the first one's slot back: the other stalled
	// connection holds its own until link.FirstByteTimeout.
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := d.Dial(ctx)
		cancel()
		if err != nil {
			t.Fatalf("edge %d: %v", i, err)
		}
		defer c.Close()
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("edge %d not handed over", i)
		}
	}
}

// One source address holds at most its share of the slots: its further
// connections are closed at once and reported, an edge from another
// address still gets in, and a connection that sends nothing is closed
// after link.FirstByteTimeout.
func TestWebSocketOneSourceHoldsItsShare(t *testing.T) {
	serverTLS, clientTLS := gateTLS(t)
	var refused atomic.Int32
	l, err := link.ListenWebSocket("127.0.0.1:0", serverTLS, link.ListenOptions{MaxHandshakes: 8, MaxHandshakesPerSource: 2,
		Refused: func(reason string) {
			if reason == "source-busy" {
				refused.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	got := serve(t, l)
	flooder := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	var conns []net.Conn
	for range 6 {
		c, err := flooder.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	closed := func(c net.Conn, within time.Duration) bool {
		_ = c.SetReadDeadline(time.Now().Add(within))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}
	open := 0
	for _, c := range conns {
		if !closed(c, 300*time.Millisecond) {
			open++
		}
	}
	if open != 2 || refused.Load() != 4 {
		t.Fatalf("%d of 6 connections from one address held, %d refused: want 2 and 4", open, refused.Load())
	}
	d := &link.WebSocketDialer{Addr: l.Addr().String(), TLS: clientTLS}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := d.Dial(ctx)
	if err != nil {
		t.Fatalf("an edge from another address: %v", err)
	}
	defer c.Close()
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("the edge from another address was not handed over")
	}
	for i, c := range conns[:2] {
		if !closed(c, link.FirstByteTimeout+2*time.Second) {
			t.Fatalf("silent connection %d still open after %s", i, link.FirstByteTimeout+2*time.Second)
		}
	}
}

// A QUIC connection gives its slot back once handed over: three edges in
// a row get in through a gate of two.
func TestQUICHandshakeSlotsReleased(t *testing.T) {
	serverTLS, clientTLS := gateTLS(t)
	l, err := link.ListenQUIC("127.0.0.1:0", serverTLS, link.ListenOptions{MaxHandshakes: 2})
	if err != nil {
		t.Fatal(err)
	}
	got := serve(t, l)
	d := &link.QUICDialer{Addr: l.Addr().String(), TLS: clientTLS}
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := d.Dial(ctx)
		if err != nil {
			cancel()
			t.Fatalf("edge %d: %v", i, err)
		}
		defer c.Close()
		// The stream is accepted once the client writes on it.
		if _, err := c.Write([]byte{0}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
		case <-ctx.Done():
			t.Fatalf("edge %d not handed over", i)
		}
		cancel()
	}
}

// A QUIC edge whose handshake stalls (its client certificate never comes)
// holds the only slot: the next attempt is refused and reported, and gets
// in once the slot is free.
func TestQUICHandshakesBounded(t *testing.T) {
	serverTLS, clientTLS := gateTLS(t)
	var refused atomic.Int64
	l, err := link.ListenQUIC("127.0.0.1:0", serverTLS, link.ListenOptions{MaxHandshakes: 1, Refused: func(string) { refused.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	got := serve(t, l)
	asked, release := make(chan struct{}), make(chan struct{})
	stalledTLS := clientTLS.Clone()
	getCert := clientTLS.GetClientCertificate
	stalledTLS.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		close(asked) // the server is in this handshake, holding the slot
		<-release
		return getCert(cri)
	}
	stalledDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := (&link.QUICDialer{Addr: l.Addr().String(), TLS: stalledTLS}).Dial(ctx)
		if err == nil {
			t.Cleanup(func() { c.Close() }) // open until handed over
			_, err = c.Write([]byte{0})
		}
		stalledDone <- err
	}()
	select {
	case <-asked:
	case err := <-stalledDone:
		t.Fatalf("the stalled edge ended: %v", err)
	}
	d := &link.QUICDialer{Addr: l.Addr().String(), TLS: clientTLS}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if c, err := d.Dial(ctx); err == nil {
		c.Close()
		t.Fatal("an edge got in while a stalled handshake held the only slot")
	}
	cancel()
	// (quic-go may turn one dial's retransmitted Initial away twice.)
	if refused.Load() == 0 {
		t.Fatal("the refusal was not reported")
	}
	close(release)
	if err := <-stalledDone; err != nil {
		t.Fatalf("stalled edge: %v", err)
	}
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled edge was not handed over once it finished")
	}
	// The refused dial's Initial, retransmitted before it gave up, may
	// reach the listener after the slot was freed and take it for a
	// handshake nobody finishes (until HandshakeIdleTimeout, 10 s): an
	// edge gets in once that ends, as a real edge retrying would.
	var c link.Conn
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err = d.Dial(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the slot was freed: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	defer c.Close()
	if _, err := c.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
}
