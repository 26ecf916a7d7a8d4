//go:build linux

package wsdiscovery

import (
	"context"
	"encoding/xml"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	peertest "github.com/dowse-dev/dowse/test/peers/onvifpeer"
)

// TestWsdd proves probing and announcements against a foreign peer, Debian's
// wsdd, in a namespace of the test's: its Hello is heard, a probe for its
// type finds it once although it answers twice, ONVIF probes do not match
// it, and its Bye is heard when it stops.
func TestWsdd(t *testing.T) {
	ns, local, peerIf, peerAddr := peertest.PeerNet(t)
	const uuid = "d0e5e000-0000-4000-8000-00000000d05e"
	endpoint := "urn:uuid:" + uuid

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var heard []Announcement
	listening := make(chan error, 2)
	// A second listener on the same interface (as two Configurations
	// make) must hear the same announcements.
	var heard2 []Announcement
	go func() {
		listening <- Listen(ctx, []net.Interface{local}, func(a Announcement) {
			mu.Lock()
			heard2 = append(heard2, a)
			mu.Unlock()
		}, nil)
	}()
	go func() {
		listening <- Listen(ctx, []net.Interface{local}, func(a Announcement) {
			mu.Lock()
			heard = append(heard, a)
			mu.Unlock()
		}, func(from netip.Addr, err error) { t.Logf("bad message from %v: %v", from, err) })
	}()
	time.Sleep(100 * time.Millisecond) // the listener joins the group

	w := peertest.StartWsdd(t, ns, peerIf, uuid)
	waitHeard := func(hello bool) Announcement {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			for _, a := range heard {
				if a.Endpoint == endpoint && a.Hello == hello {
					mu.Unlock()
					return a
				}
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("no %s from wsdd within 10s", map[bool]string{true: "Hello", false: "Bye"}[hello])
		return Announcement{}
	}
	hello := waitHeard(true)
	// wsdd's Hello names no types (WS-Discovery allows it: a client that
	// cares probes), so a handler must answer a typeless Hello with a probe.
	if hello.From != peerAddr || hello.Interface != local.Name || len(hello.Types) != 0 || len(hello.XAddrs) != 1 || !strings.Contains(hello.XAddrs[0], uuid) {
		t.Errorf("hello %+v", hello)
	}

	var bad []string
	found, err := Probe(ctx, []net.Interface{local}, time.Second, func(from netip.Addr, err error) { bad = append(bad, err.Error()) },
		[]xml.Name{TypeDevProfDevice})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 || found[0].Endpoint != endpoint || found[0].From != peerAddr || len(found[0].XAddrs) != 0 && !strings.Contains(found[0].XAddrs[0], uuid) {
		t.Errorf("probe for wsdp:Device found %+v", found)
	}
	found, err = Probe(ctx, []net.Interface{local}, time.Second, nil, []xml.Name{TypeNetworkVideoTransmitter}, []xml.Name{TypeONVIFDevice})
	if err != nil || len(found) != 0 {
		t.Errorf("ONVIF probes found %+v, %v; want nothing from wsdd", found, err)
	}
	if len(bad) > 0 {
		t.Errorf("bad messages: %q", bad)
	}

	w.Stop()
	bye := waitHeard(false)
	if bye.From != peerAddr {
		t.Errorf("bye %+v", bye)
	}
	mu.Lock()
	if len(heard2) != len(heard) {
		t.Errorf("second listener heard %d announcements, the first %d", len(heard2), len(heard))
	}
	mu.Unlock()
	cancel()
	for range 2 {
		if err := <-listening; err != nil {
			t.Errorf("Listen = %v", err)
		}
	}
}
