// Package faultproxy sits between a link's edge and cloud in tests and
// injects network faults on command: a TCP proxy (WebSocket transport) that
// cuts connections mid-stream, delays, or blackholes them, and a UDP relay
// (QUIC transport) that delays, loses or blackholes datagrams.
package faultproxy

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// TCP forwards connections from Addr to a target.
type TCP struct {
	l      net.Listener
	target string

	delay     atomic.Int64 // nanoseconds per chunk
	blackhole atomic.Bool

	mu    sync.Mutex
	pipes map[*pipe]struct{}
	wg    sync.WaitGroup
}

type pipe struct {
	a, b net.Conn
	cut  atomic.Int64 // bytes left before the cut; <0 none
}

func (p *pipe) close() { p.a.Close(); p.b.Close() }

// NewTCP listens on 127.0.0.1 and forwards to target.
func NewTCP(target string) (*TCP, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &TCP{l: l, target: target, pipes: map[*pipe]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is where the edge should dial.
func (p *TCP) Addr() string { return p.l.Addr().String() }

// SetTarget points new connections elsewhere (a restarted cloud).
func (p *TCP) SetTarget(t string) { p.mu.Lock(); p.target = t; p.mu.Unlock() }

func (p *TCP) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if p.blackhole.Load() {
			// The network is down: new connections fail at once (as with an
			// unreachable route) rather than hang the dialer.
			c.Close()
			continue
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		pp := &pipe{a: c, b: up}
		pp.cut.Store(-1)
		p.mu.Lock()
		p.pipes[pp] = struct{}{}
		p.mu.Unlock()
		go p.copy(pp, c, up)
		go p.copy(pp, up, c)
	}
}

func (p *TCP) copy(pp *pipe, dst, src net.Conn) {
	defer func() {
		pp.close()
		p.mu.Lock()
		delete(p.pipes, pp)
		p.mu.Unlock()
	}()
	buf := make([]byte, 16<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := p.delay.Load(); d > 0 {
				time.Sleep(time.Duration(d))
			}
			if p.blackhole.Load() {
				continue
			}
			chunk := buf[:n]
			if left := pp.cut.Load(); left >= 0 {
				if int64(n) >= left {
					_, _ = dst.Write(chunk[:left])
					return
				}
				pp.cut.Add(-int64(n))
			}
			if _, werr := dst.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Cut closes every current connection after forwarding up to n more bytes
// (0: at once), so that the cut usually falls inside a frame.
func (p *TCP) Cut(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pp := range p.pipes {
		if n == 0 {
			pp.close()
		} else {
			pp.cut.Store(int64(n))
		}
	}
}

// Delay holds every forwarded chunk for d (0: none).
func (p *TCP) Delay(d time.Duration) { p.delay.Store(int64(d)) }

// Blackhole drops all traffic while on, leaving connections open: only
// heartbeats can notice. New connections are refused meanwhile.
func (p *TCP) Blackhole(on bool) { p.blackhole.Store(on) }

// Close stops the proxy and its connections.
func (p *TCP) Close() {
	p.l.Close()
	p.Cut(0)
	p.wg.Wait()
}

// UDP relays datagrams from Addr to a target, one upstream socket per client
// address.
type UDP struct {
	c      *net.UDPConn
	target *net.UDPAddr

	delay     atomic.Int64
	lossPct   atomic.Int64
	blackhole atomic.Bool

	mu    sync.Mutex
	flows map[string]*net.UDPConn
	done  chan struct{}
}

// NewUDP listens on 127.0.0.1 and relays to target.
func NewUDP(target string) (*UDP, error) {
	ta, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		return nil, err
	}
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	u := &UDP{c: c, target: ta, flows: map[string]*net.UDPConn{}, done: make(chan struct{})}
	go u.serve()
	return u, nil
}

// Addr is where the edge should dial.
func (u *UDP) Addr() string { return u.c.LocalAddr().String() }

// Delay holds every datagram for d; Loss drops pct percent of them at
// random; Blackhole drops all of them while on.
func (u *UDP) Delay(d time.Duration) { u.delay.Store(int64(d)) }
func (u *UDP) Loss(pct int)          { u.lossPct.Store(int64(pct)) }
func (u *UDP) Blackhole(on bool)     { u.blackhole.Store(on) }

func (u *UDP) pass() bool {
	if u.blackhole.Load() {
		return false
	}
	if l := u.lossPct.Load(); l > 0 && rand.IntN(100) < int(l) {
		return false
	}
	return true
}

func (u *UDP) send(c *net.UDPConn, to *net.UDPAddr, b []byte) {
	if !u.pass() {
		return
	}
	if d := time.Duration(u.delay.Load()); d > 0 {
		cp := append([]byte(nil), b...)
		time.AfterFunc(d, func() { u.write(c, to, cp) })
		return
	}
	u.write(c, to, b)
}

func (u *UDP) write(c *net.UDPConn, to *net.UDPAddr, b []byte) {
	if to == nil {
		_, _ = c.Write(b)
	} else {
		_, _ = c.WriteToUDP(b, to)
	}
}

func (u *UDP) serve() {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := u.c.ReadFromUDP(buf)
		if err != nil {
			return
		}
		u.mu.Lock()
		up := u.flows[from.String()]
		if up == nil {
			up, err = net.DialUDP("udp", nil, u.target)
			if err != nil {
				u.mu.Unlock()
				continue
			}
			u.flows[from.String()] = up
			go u.back(up, from)
		}
		u.mu.Unlock()
		u.send(up, nil, buf[:n])
	}
}

func (u *UDP) back(up *net.UDPConn, client *net.UDPAddr) {
	buf := make([]byte, 64<<10)
	for {
		n, err := up.Read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
				return
			}
			select {
			case <-u.done:
				return
			default:
				continue // ICMP port unreachable while the cloud restarts
			}
		}
		u.send(u.c, client, buf[:n])
	}
}

// Close stops the relay.
func (u *UDP) Close() {
	close(u.done)
	u.c.Close()
	u.mu.Lock()
	for _, f := range u.flows {
		f.Close()
	}
	u.mu.Unlock()
}
