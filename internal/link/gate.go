package link

import (
	"context"
	"errors"
	"net"
	"sync"
)

// DefaultMaxHandshakes bounds the connections a listener holds between
// accepting them and handing them over (TLS handshake, WebSocket upgrade,
// QUIC stream).
const DefaultMaxHandshakes = 256

// errTooManyHandshakes refuses a QUIC connection attempt while the gate is
// full (the edge retries with backoff).
var errTooManyHandshakes = errors.New("link: too many handshakes in progress")

// handshakeGate bounds the connections in their handshake: each costs a
// goroutine, buffers and TLS CPU before its certificate is known, so a flood
// of connections that never finish (or finish slowly) must not take the
// hub's memory or starve the edges that do finish. A WebSocket listener
// stops accepting while the gate is full (connections wait in the kernel's
// backlog); QUIC refuses the attempt and asks for address validation once
// the gate is half full.
type handshakeGate struct{ slots chan struct{} }

func newHandshakeGate(n int) *handshakeGate {
	if n <= 0 {
		n = DefaultMaxHandshakes
	}
	return &handshakeGate{slots: make(chan struct{}, n)}
}

func (g *handshakeGate) tryEnter() *admission {
	select {
	case g.slots <- struct{}{}:
		return &admission{g: g}
	default:
		return nil
	}
}

func (g *handshakeGate) enter(done <-chan struct{}) *admission {
	select {
	case g.slots <- struct{}{}:
		return &admission{g: g}
	case <-done:
		return nil
	}
}

// busy reports whether more than half the slots are taken.
func (g *handshakeGate) busy() bool { return len(g.slots) > cap(g.slots)/2 }

// admission is one connection's slot, released once: when the connection
// is handed over or closes, whichever comes first.
type admission struct {
	g    *handshakeGate
	once sync.Once
}

func (a *admission) release() { a.once.Do(func() { <-a.g.slots }) }

type admissionKey struct{}

// releaseFrom releases the admission ctx carries, if any.
func releaseFrom(ctx context.Context) {
	if a, ok := ctx.Value(admissionKey{}).(*admission); ok {
		a.release()
	}
}

// gatedListener accepts a TCP connection only when the gate has room.
type gatedListener struct {
	net.Listener
	gate *handshakeGate
	done <-chan struct{}
}

func (l *gatedListener) Accept() (net.Conn, error) {
	a := l.gate.enter(l.done)
	if a == nil {
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		a.release()
		return nil, err
	}
	return &gatedConn{Conn: c, adm: a}, nil
}

type gatedConn struct {
	net.Conn
	adm *admission
}

func (c *gatedConn) Close() error {
	c.adm.release()
	return c.Conn.Close()
}
