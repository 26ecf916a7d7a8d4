package link

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"
)

// DefaultMaxHandshakes bounds the connections a listener holds between
// accepting them and handing them over (TLS handshake, WebSocket upgrade,
// QUIC stream).
const DefaultMaxHandshakes = 256

// DefaultMaxHandshakesPerSource bounds the slots one source address holds
// (a share of the gate: one host's flood leaves the rest to the others).
const DefaultMaxHandshakesPerSource = 16

// FirstByteTimeout is how long an accepted TCP connection may stay silent
// before its TLS ClientHello starts: a connection opened only to hold a
// slot goes in seconds, not at the end of the whole handshake's time.
const FirstByteTimeout = 3 * time.Second

// errTooManyHandshakes refuses a QUIC connection attempt while the gate is
// full (the edge retries with backoff).
var errTooManyHandshakes = errors.New("link: too many handshakes in progress")

// errSourceBusy refuses a connection from a source address that holds its
// share of the gate already.
var errSourceBusy = errors.New("link: too many handshakes in progress from this address")

// handshakeGate bounds the connections in their handshake: each costs a
// goroutine, buffers and TLS CPU before its certificate is known, so a flood
// of connections that never finish (or finish slowly) must not take the
// hub's memory or starve the edges that do finish. A WebSocket listener
// stops accepting while the gate is full (connections wait in the kernel's
// backlog); QUIC refuses the attempt and asks for address validation once
// the gate is half full.
// Each source address holds at most perSource of the slots.
type handshakeGate struct {
	slots     chan struct{}
	perSource int

	mu       sync.Mutex
	bySource map[netip.Addr]int
}

func newHandshakeGate(n, perSource int) *handshakeGate {
	if n <= 0 {
		n = DefaultMaxHandshakes
	}
	if perSource <= 0 {
		perSource = DefaultMaxHandshakesPerSource
	}
	return &handshakeGate{slots: make(chan struct{}, n), perSource: min(perSource, n), bySource: map[netip.Addr]int{}}
}

// bind counts a's connection against its source address; false (and
// nothing counted) when the source holds its share already.
func (g *handshakeGate) bind(a *admission, remote net.Addr) bool {
	src, ok := sourceOf(remote)
	if !ok {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.bySource[src] >= g.perSource {
		return false
	}
	g.bySource[src]++
	a.src, a.bound = src, true
	return true
}

func (g *handshakeGate) unbind(src netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.bySource[src] <= 1 {
		delete(g.bySource, src)
		return
	}
	g.bySource[src]--
}

// sourceOf is remote's IP address (an IPv4-mapped IPv6 address as IPv4).
func sourceOf(remote net.Addr) (netip.Addr, bool) {
	var ip net.IP
	switch a := remote.(type) {
	case *net.TCPAddr:
		ip = a.IP
	case *net.UDPAddr:
		ip = a.IP
	default:
		return netip.Addr{}, false
	}
	addr, ok := netip.AddrFromSlice(ip)
	return addr.Unmap(), ok
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
	g     *handshakeGate
	once  sync.Once
	src   netip.Addr
	bound bool
}

func (a *admission) release() {
	a.once.Do(func() {
		if a.bound {
			a.g.unbind(a.src)
		}
		<-a.g.slots
	})
}

type admissionKey struct{}

// releaseFrom releases the admission ctx carries, if any.
func releaseFrom(ctx context.Context) {
	if a, ok := ctx.Value(admissionKey{}).(*admission); ok {
		a.release()
	}
}

// gatedListener accepts a TCP connection only when the gate has room, and
// closes at once one whose source address holds its share.
type gatedListener struct {
	net.Listener
	gate *handshakeGate
	done <-chan struct{}
	// refused, when set, is told of each connection closed for its source.
	refused func(reason string)
}

func (l *gatedListener) Accept() (net.Conn, error) {
	for {
		a := l.gate.enter(l.done)
		if a == nil {
			return nil, net.ErrClosed
		}
		c, err := l.Listener.Accept()
		if err != nil {
			a.release()
			return nil, err
		}
		if !l.gate.bind(a, c.RemoteAddr()) {
			a.release()
			_ = c.Close()
			if l.refused != nil {
				l.refused("source-busy")
			}
			continue
		}
		return &gatedConn{Conn: c, adm: a}, nil
	}
}

type gatedConn struct {
	net.Conn
	adm *admission
}

func (c *gatedConn) Close() error {
	c.adm.release()
	return c.Conn.Close()
}
