package handler_test

import (
	"context"
	"fmt"
	"testing"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
)

// TestSkippedReachesAgent: skipped candidates go with the device list, a
// change of them alone is sent though the devices are the same, and what is
// sent is bounded (the first few candidates per reason by name, the
// reasons with most candidates).
func TestSkippedReachesAgent(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	disc := discoverFunc(func(ctx context.Context, _ *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
		var s handler.Skipped
		s.Add("AuthRefused", "http://10.0.0.1/onvif/device_service", "HTTP 401")
		handler.SetSkipped(ctx, &s)
		if err := send(devices("a")); err != nil {
			return err
		}
		handler.SetSkipped(ctx, &s) // the same again: nothing to send
		if err := send(devices("a")); err != nil {
			return err
		}
		for i := range 10 {
			s.Add("NoReply", fmt.Sprintf("10.0.1.%d:502", 9-i), "i/o timeout")
		}
		for i := range handler.MaxSkippedReasons + 4 {
			s.Add(fmt.Sprintf("Rare%02d", i), "x", "")
		}
		handler.SetSkipped(ctx, &s)
		if err := send(devices("a")); err != nil {
			return err
		}
		handler.SetSkipped(ctx, &handler.Skipped{})
		if err := send(devices("a")); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	})
	srv := start(t, handler.Config{StateDir: dir, Discoverer: disc})
	stream := handlertest.Discover(t, srv.Endpoint(), &discoveryv1.DiscoverRequest{})

	first := stream.NextResponse(t, wait)
	if sk := first.GetSkipped(); len(sk) != 1 || sk[0].GetReason() != "AuthRefused" || sk[0].GetCount() != 1 || sk[0].GetCandidates()[0].GetMessage() != "HTTP 401" {
		t.Fatalf("first message skipped %v", sk)
	}
	second := stream.NextResponse(t, wait)
	sk := second.GetSkipped()
	if len(sk) != handler.MaxSkippedReasons {
		t.Fatalf("%d reasons sent, want the bound %d: %v", len(sk), handler.MaxSkippedReasons, sk)
	}
	byReason := map[string]*discoveryv1.SkippedReason{}
	for _, r := range sk {
		byReason[r.GetReason()] = r
	}
	no := byReason["NoReply"]
	if no == nil || no.GetCount() != 10 || len(no.GetCandidates()) != handler.MaxSkippedCandidates ||
		no.GetCandidates()[0].GetCandidate() != "10.0.1.0:502" || no.GetCandidates()[handler.MaxSkippedCandidates-1].GetCandidate() != "10.0.1.4:502" {
		t.Errorf("NoReply = %v, want count 10 and the first %d candidates by name", no, handler.MaxSkippedCandidates)
	}
	if byReason["AuthRefused"] == nil {
		t.Errorf("AuthRefused (count 1) was dropped for reasons of the same count sorted after it: %v", sk)
	}
	if third := stream.NextResponse(t, wait); len(third.GetSkipped()) != 0 || len(third.GetDevices()) != 1 {
		t.Errorf("cleared skipped: %v", third)
	}
}
