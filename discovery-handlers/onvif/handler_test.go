//go:build linux

package onvif

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	peertest "github.com/dowse-dev/dowse/test/peers/onvifpeer"
)

func runHandler(t *testing.T) *discoveryv1.RegisterDiscoveryHandlerRequest {
	t.Helper()
	cfg := Handler()
	cfg.Logger = testr.New(t)
	reg := handlertest.Run(t, cfg)
	if !reg.GetShared() {
		t.Error("ONVIF handler registered as not shared")
	}
	return reg
}

// TestHandlerWithWsdd runs the handler against Debian's wsdd, a foreign
// WS-Discovery peer that is no camera, in a namespace of the test's. With
// the ONVIF probe types wsdd never answers; probing for its own type
// (wsdp:Device) it answers and its Hello (which names no types) triggers a
// probe, but its device service is no ONVIF one, so it is skipped and the
// skipped candidates say why. Either way no device is listed, and the
// handler keeps serving.
func TestHandlerWithWsdd(t *testing.T) {
	ns, local, peerIf, _ := peertest.PeerNet(t)
	const uuid = "d0e5e000-0000-4000-8000-00000000d05f"
	reg := runHandler(t)

	wsdp := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(
		`{"interfaces": [%q], "probeTypes": ["wsdp:Device"], "probeInterval": "1s"}`, local.Name)})
	onvifOnly := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(
		`{"interfaces": [%q], "probeInterval": "1s"}`, local.Name)})
	for _, s := range []*handlertest.Stream{wsdp, onvifOnly} {
		if devs := s.Next(t, 5*time.Second); len(devs) != 0 {
			t.Fatalf("before wsdd: %v", devs)
		}
	}
	w := peertest.StartWsdd(t, ns, peerIf, uuid)
	// Probing for wsdp:Device finds wsdd, whose device service is no ONVIF
	// one: no device, and the skipped candidates say so.
	resp := wsdp.NextResponse(t, 10*time.Second)
	if sk := resp.GetSkipped(); len(resp.GetDevices()) != 0 || len(sk) != 1 || sk[0].GetReason() != SkipDeviceServiceFailed || !strings.Contains(sk[0].GetCandidates()[0].GetCandidate(), uuid) {
		t.Fatalf("with wsdd up: %v", resp)
	}
	// Several probe rounds with wsdd up.
	time.Sleep(3500 * time.Millisecond)
	w.Stop()
	onvifOnly.Close()
	onvifOnly.Err(t, 5*time.Second) // fails the test if a list was sent
	for _, m := range wsdp.Rest(t, 5*time.Second) {
		if len(m.GetDevices()) != 0 {
			t.Errorf("wsdd listed: %v", m)
		}
	}
}
