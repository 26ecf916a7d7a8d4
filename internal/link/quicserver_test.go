package link_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/link"
)

// TestQUICServerWaitReadable: the server end of a QUIC connection waits
// for data with WaitReadable (as the link's reader does) and then reads
// the byte it took first, by Read and by ReadByte alike, also when the
// data comes after the wait began.
func TestQUICServerWaitReadable(t *testing.T) {
	serverTLS, clientTLS := gateTLS(t)
	l, err := link.ListenQUIC("127.0.0.1:0", serverTLS, link.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := serve(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := (&link.QUICDialer{Addr: l.Addr().String(), TLS: clientTLS}).Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// The server learns of the stream with its first data.
	if _, err := cl.Write([]byte("hello world")); err != nil {
		t.Fatal(err)
	}
	var c link.Conn
	select {
	case c = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no connection handed over")
	}
	if len(c.PeerCertificates()) == 0 {
		t.Error("the server end has no client certificate")
	}
	if s := string(readAll(t, c, len("hello world"))); s != "hello world" {
		t.Errorf("read %q", s)
	}

	// A wait that begins before the data, then ReadByte and Read.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _ = cl.Write([]byte("later"))
	}()
	w := c.(interface{ WaitReadable() error })
	if err := w.WaitReadable(); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitReadable(); err != nil { // a second wait takes nothing more
		t.Fatal(err)
	}
	b, err := c.(io.ByteReader).ReadByte()
	if err != nil || b != 'l' {
		t.Fatalf("ReadByte after the wait: %q, %v; want 'l'", b, err)
	}
	if s := string(readAll(t, c, 4)); s != "ater" {
		t.Errorf("read %q after ReadByte, want \"ater\"", s)
	}

	// The client goes: the wait ends with an error.
	cl.Close()
	done := make(chan error, 1)
	go func() { done <- w.WaitReadable() }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("WaitReadable on a closed connection returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitReadable did not return after the client closed")
	}
}
