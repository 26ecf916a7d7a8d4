//go:build linux

package onvif

import (
	"fmt"
	"os/exec"
	"slices"
	"testing"
	"time"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	peertest "github.com/dowse-dev/dowse/test/peers/onvifpeer"
)

// waitIDs reads the stream until a list with exactly ids arrives and
// returns it and when it arrived.
func waitIDs(t *testing.T, s *handlertest.Stream, timeout time.Duration, ids ...string) ([]*discoveryv1.Device, time.Time) {
	t.Helper()
	slices.Sort(ids)
	deadline := time.Now().Add(timeout)
	var last []string
	for {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("no list %q within %v; last %q", ids, timeout, last)
		}
		devs := s.Next(t, left)
		last = handlertest.IDs(devs)
		if slices.Equal(last, ids) {
			return devs, time.Now()
		}
	}
}

// TestHandlerCameras runs fake cameras (WS-Discovery and a device service)
// in a namespace of the test's: two cameras are found with their MAC and
// stream URI, one with WS-Security credentials per device, per MAC or by
// default; filters by UUID, scope and MAC keep the right ones; cameras that
// answer garbage WS-Discovery or SOAP, or lie in their XAddrs, are skipped
// without stopping the others; a
// camera that stops answering is dropped after failureThreshold probes, one
// that says Bye at once, and a camera's Hello lists it without waiting for
// a probe.
func TestHandlerCameras(t *testing.T) {
	ns, local, peerIf, peerAddr := peertest.PeerNet(t)
	const (
		uuidA = "aaaaaaaa-0000-4000-8000-00000000000a"
		uuidB = "bbbbbbbb-0000-4000-8000-00000000000b"
		uuidC = "cccccccc-0000-4000-8000-00000000000c"
		uuidG = "99999999-0000-4000-8000-000000000009" // garbage WS-Discovery
		uuidS = "55555555-0000-4000-8000-000000000005" // garbage SOAP
		uuidL = "11111111-0000-4000-8000-000000000001" // lies in its XAddrs
	)
	// The neighbour table gives camera A's MAC for per-MAC credentials.
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "dev", peerIf, "address", "c0:56:e3:00:00:0a").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	camA := peertest.StartCamera(t, ns, peerIf, &peertest.Camera{UUID: uuidA, Addr: peerAddr.String(), MAC: "C0:56:E3:00:00:0A",
		Scopes: []string{"onvif://www.onvif.org/name/gate"}, Username: "admin", Password: "s3cret"})
	camB := peertest.StartCamera(t, ns, peerIf, &peertest.Camera{UUID: uuidB, Addr: peerAddr.String(), MAC: "c0:56:e3:00:00:0b", Scopes: []string{"onvif://www.onvif.org/name/yard"}})
	peertest.StartCamera(t, ns, peerIf, &peertest.Camera{UUID: uuidG, Addr: peerAddr.String(), Garbage: true})
	peertest.StartCamera(t, ns, peerIf, &peertest.Camera{UUID: uuidS, Addr: peerAddr.String(), BadSOAP: true})
	peertest.StartCamera(t, ns, peerIf, &peertest.Camera{UUID: uuidL, Addr: peerAddr.String(), AnnounceXAddr: "http://" + peerAddr.String() + ":1/onvif/device_service"})

	reg := runHandler(t)
	creds := func(pairs ...string) map[string]*discoveryv1.ByteData {
		m := map[string]*discoveryv1.ByteData{}
		for i := 0; i < len(pairs); i += 2 {
			m[pairs[i]] = &discoveryv1.ByteData{Vec: []byte(pairs[i+1])}
		}
		return m
	}
	discover := func(details string, props map[string]*discoveryv1.ByteData) *handlertest.Stream {
		return handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: details, DiscoveryProperties: props})
	}
	// Per-device credentials for A; wrong default ones must not be used
	// for it.
	all := discover(fmt.Sprintf(`{"interfaces": [%q], "probeInterval": "1s", "failureThreshold": 2}`, local.Name),
		creds("username_"+uuidA, "admin", "password_"+uuidA, "s3cret", "username", "nobody", "password", "x"))
	notB := discover(fmt.Sprintf(`{"interfaces": [%q], "probeInterval": "1s", "uuids": {"action": "Exclude", "items": ["urn:uuid:%s"]}}`, local.Name, uuidB),
		creds("username", "admin", "password", "s3cret"))
	gateOnly := discover(fmt.Sprintf(`{"interfaces": [%q], "probeInterval": "60s", "scopes": {"items": ["onvif://www.onvif.org/name/gate*"]}}`, local.Name),
		creds("username_c056e300000a", "admin", "password_c056e300000a", "s3cret"))
	macB := discover(fmt.Sprintf(`{"interfaces": [%q], "probeInterval": "60s", "macAddresses": {"items": ["c0-56-e3-00-00-0b"]}}`, local.Name), nil)
	noCreds := discover(fmt.Sprintf(`{"interfaces": [%q], "probeInterval": "60s"}`, local.Name), nil)

	devs, _ := waitIDs(t, all, 10*time.Second, uuidA, uuidB)
	want := map[string]string{
		DeviceServiceURLProperty: camA.XAddr(),
		DeviceUUIDProperty:       uuidA,
		DeviceIPAddressProperty:  peerAddr.String(),
		DeviceMACAddressProperty: "c0:56:e3:00:00:0a",
		StreamURIProperty:        camA.StreamURI(),
	}
	for k, v := range want {
		if devs[0].Properties[k] != v {
			t.Errorf("camera A property %s = %q, want %q", k, devs[0].Properties[k], v)
		}
	}
	if devs[1].Properties[StreamURIProperty] != camB.StreamURI() {
		t.Errorf("camera B properties %v", devs[1].Properties)
	}
	waitIDs(t, notB, 10*time.Second, uuidA)
	waitIDs(t, macB, 10*time.Second, uuidB)
	// Without credentials camera A refuses the handler: skipped.
	waitIDs(t, noCreds, 10*time.Second, uuidB)

	waitIDs(t, gateOnly, 10*time.Second, uuidA)

	// Camera B loses power: no Bye, no answers. It goes after two probes.
	camB.Silence()
	start := time.Now()
	waitIDs(t, all, 10*time.Second, uuidA)
	t.Logf("silent camera dropped after %v (probe interval 1s, failureThreshold 2)", time.Since(start))

	// Camera C plugs in and says Hello: listed without waiting for a probe
	// (the gateOnly stream probes once a minute, the others every second).
	camC := peertest.StartCamera(t, ns, peerIf, &peertest.Camera{UUID: uuidC, Addr: peerAddr.String(), Scopes: []string{"onvif://www.onvif.org/name/gate-2"}})
	start = time.Now()
	if err := camC.Hello(); err != nil {
		t.Fatal(err)
	}
	_, at := waitIDs(t, gateOnly, 5*time.Second, uuidA, uuidC)
	t.Logf("FIGURE: a camera's Hello to the device in the Discover stream: %v", at.Sub(start))
	if at.Sub(start) > 500*time.Millisecond {
		t.Errorf("Hello took %v to reach the stream", at.Sub(start))
	}

	// Camera A says Bye.
	start = time.Now()
	if err := camA.Bye(); err != nil {
		t.Fatal(err)
	}
	_, at = waitIDs(t, gateOnly, 5*time.Second, uuidC)
	t.Logf("FIGURE: a camera's Bye to the device leaving the Discover stream: %v", at.Sub(start))
}
