package link_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/link"
)

// rawWS is a hand-written WebSocket client: it lets a test put frames
// into TLS records exactly as it wants.
type rawWS struct {
	c  *tls.Conn
	br *bufio.Reader
}

func dialRawWS(t *testing.T, addr string, conf *tls.Config, path string) (*rawWS, int) {
	t.Helper()
	conf = conf.Clone()
	conf.NextProtos = []string{"http/1.1"}
	c, err := tls.Dial("tcp", addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", path, addr)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return &rawWS{c: c, br: br}, resp.StatusCode
}

// frame is a masked client frame.
func frame(op byte, payload []byte) []byte {
	mask := [4]byte{1, 2, 3, 4}
	b := []byte{0x80 | op}
	switch n := len(payload); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	case n <= 0xffff:
		b = binary.BigEndian.AppendUint16(append(b, 0x80|126), uint16(n))
	default:
		b = binary.BigEndian.AppendUint64(append(b, 0x80|127), uint64(n))
	}
	b = append(b, mask[:]...)
	for i, c := range payload {
		b = append(b, c^mask[i%4])
	}
	return b
}

// readFrame reads one server frame (unmasked).
func (w *rawWS) readFrame(t *testing.T) (op byte, payload []byte) {
	t.Helper()
	_ = w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var h [2]byte
	if _, err := io.ReadFull(w.br, h[:]); err != nil {
		t.Fatal(err)
	}
	if h[1]&0x80 != 0 {
		t.Fatal("the server masked a frame")
	}
	n := int(h[1] & 0x7f)
	switch n {
	case 126:
		var l [2]byte
		_, _ = io.ReadFull(w.br, l[:])
		n = int(binary.BigEndian.Uint16(l[:]))
	case 127:
		var l [8]byte
		_, _ = io.ReadFull(w.br, l[:])
		n = int(binary.BigEndian.Uint64(l[:]))
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(w.br, payload); err != nil {
		t.Fatal(err)
	}
	return h[0] & 0x0f, payload
}

// readAll reads n bytes from a server-side Conn, waiting with WaitReadable
// as the link's reader does.
func readAll(t *testing.T, c link.Conn, n int) []byte {
	t.Helper()
	w, ok := c.(interface{ WaitReadable() error })
	if !ok {
		t.Fatal("the server's connection cannot wait for data")
	}
	out := make([]byte, 0, n)
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 7) // odd sizes: reads end inside frames
		for len(out) < n {
			if err := w.WaitReadable(); err != nil {
				done <- err
				return
			}
			k, err := c.Read(buf[:min(len(buf), n-len(out))])
			out = append(out, buf[:k]...)
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("read %d of %d bytes, then waited: data buffered in TLS went unnoticed", len(out), n)
	}
	return out
}

// TestWebSocketServerFrames: the server end reads masked binary frames as
// one byte stream, also when several frames (and a ping) share one TLS
// record, which WaitReadable must see without waiting on the socket;
// answers a ping with its pong; writes small and large frames unmasked;
// and answers a request for another path with 404.
func TestWebSocketServerFrames(t *testing.T) {
	serverTLS, clientTLS := gateTLS(t)
	l, err := link.ListenWebSocket("127.0.0.1:0", serverTLS, link.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := serve(t, l)

	if _, code := dialRawWS(t, l.Addr().String(), clientTLS, "/elsewhere"); code != http.StatusNotFound {
		t.Errorf("a WebSocket to another path: HTTP %d, want 404", code)
	}

	ws, code := dialRawWS(t, l.Addr().String(), clientTLS, link.WebSocketPath)
	if code != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: HTTP %d", code)
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

	// Three frames and a ping in one write: one TLS record.
	var rec []byte
	rec = append(rec, frame(0x2, []byte("hello "))...)
	rec = append(rec, frame(0x9, []byte("ping!"))...)
	rec = append(rec, frame(0x2, []byte("wonderful "))...)
	rec = append(rec, frame(0x0, []byte("world"))...) // a continuation
	if _, err := ws.c.Write(rec); err != nil {
		t.Fatal(err)
	}
	if s := string(readAll(t, c, len("hello wonderful world"))); s != "hello wonderful world" {
		t.Errorf("read %q", s)
	}
	if op, p := ws.readFrame(t); op != 0xa || string(p) != "ping!" {
		t.Errorf("answer to a ping: opcode %d %q, want a pong with its payload", op, p)
	}

	// Later frames, each in a record of its own, after the reader waited.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _ = ws.c.Write(frame(0x2, []byte("later")))
	}()
	if s := string(readAll(t, c, 5)); s != "later" {
		t.Errorf("read %q", s)
	}
	big := []byte(strings.Repeat("x", 70000))
	if _, err := ws.c.Write(frame(0x2, big)); err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, c, len(big)); string(b) != string(big) {
		t.Errorf("a 70,000-byte frame read back as %d bytes", len(b))
	}

	// Writes: one frame each, unmasked, small and large.
	for _, p := range [][]byte{[]byte("small"), big} {
		if _, err := c.Write(p); err != nil {
			t.Fatal(err)
		}
		if op, b := ws.readFrame(t); op != 0x2 || string(b) != string(p) {
			t.Errorf("frame written: opcode %d, %d bytes; want binary, %d", op, len(b), len(p))
		}
	}

	// A close frame ends the stream.
	_, _ = ws.c.Write(frame(0x8, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 1)); errc <- err }()
	select {
	case err := <-errc:
		if !errors.Is(err, io.EOF) {
			t.Errorf("read after a close frame: %v, want EOF", err)
		}
	case <-ctx.Done():
		t.Error("a close frame did not end the stream")
	}
	c.Close()
}
