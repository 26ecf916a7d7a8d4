//go:build linux

package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dowse-dev/dowse/discovery-handlers/onvif"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	peertest "github.com/dowse-dev/dowse/test/peers/onvifpeer"
)

// TestONVIFExplainsSkippedCamera runs the real ONVIF handler beside an agent
// against go2rtc behind Debian's lighttpd, which requires HTTP Digest of
// every request (a camera that insists on Digest), in a network namespace
// of the test's. A Configuration with a wrong password finds no device, and
// its node's entry in status.nodes and a Warning Event on it say why: the
// camera refused the credentials (AuthRefused), naming its device service.
// One with the right password gets the camera's Instance, its stream URI
// read through Digest.
func TestONVIFExplainsSkippedCamera(t *testing.T) {
	if os.Geteuid() != 0 {
		peertest.Unavailable(t, "needs root for a network namespace")
	}
	ns, local, peerIf, peerAddr := peertest.PeerNet(t)
	peertest.StartGo2rtc(t, ns, "127.0.0.1:1984", peerAddr.String()+":8554", "")
	proxy := peerAddr.String() + ":8080"
	peertest.StartDigestProxy(t, ns, proxy, "127.0.0.1:1984", "plant", "s3cret-Pw")
	service := "http://" + proxy + "/onvif/device_service"
	const uuid = "60260000-0000-4000-8000-0000000ee1e7"
	peertest.StartCamera(t, ns, peerIf, &peertest.Camera{UUID: uuid, Addr: peerAddr.String(), AnnounceXAddr: service})

	dir := stateDir(t)
	const node = "onvif-node"
	startAgent(t, node, dir)
	cfg := onvif.Handler()
	cfg.StateDir, cfg.Logger = dir, testr.New(t).WithName("onvif")
	handlertest.Serve(t, cfg)

	nsName := suite.Namespace(t)
	details := fmt.Sprintf(`{"interfaces": [%q], "probeInterval": "2s"}`, local.Name)
	creds := func(pw string) func(*v1alpha1.Configuration) {
		return func(c *v1alpha1.Configuration) {
			c.Spec.DiscoveryHandler.DiscoveryProperties = []v1alpha1.DiscoveryProperty{
				{Name: onvif.UsernameProperty, Value: ptr.To("plant")}, {Name: onvif.PasswordProperty, Value: ptr.To(pw)}}
		}
	}
	wrong := createConfiguration(t, nsName, "camera-wrong-password", "onvif", details, creds("guess"))
	createConfiguration(t, nsName, "camera", "onvif", details, creds("s3cret-Pw"))

	expectCount(t, nsName, "camera", 1, 30*time.Second)
	testwait.For(t, 30*time.Second, func() error {
		st := nodeStatus(t, nsName, wrong.Name, node)
		if st == nil || len(st.Skipped) != 1 {
			return fmt.Errorf("status %+v", st)
		}
		sk := st.Skipped[0]
		if sk.Reason != onvif.SkipAuthRefused || sk.Count != 1 || len(sk.Candidates) != 1 || sk.Candidates[0].Candidate != service ||
			!strings.Contains(sk.Candidates[0].Message, "401") {
			return fmt.Errorf("skipped %+v, want AuthRefused naming %s", sk, service)
		}
		t.Logf("status.nodes[%s].skipped: %+v", node, st.Skipped)
		return nil
	})
	if n := len(listInstances(t, nsName, wrong.Name)); n != 0 {
		t.Errorf("a wrong password gave %d Instances", n)
	}
	testwait.For(t, 30*time.Second, func() error {
		evs, err := suite.Clientset.EventsV1().Events(nsName).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Regarding.Name == wrong.Name && e.Reason == onvif.SkipAuthRefused && e.Type == "Warning" && e.ReportingController == "dowse-agent" &&
				strings.Contains(e.Note, node) && strings.Contains(e.Note, service) {
				t.Logf("event: %s %s: %s", e.Type, e.Reason, e.Note)
				return nil
			}
			seen = append(seen, describe(e))
		}
		return fmt.Errorf("no AuthRefused Event on %s: %v", wrong.Name, seen)
	})
	for _, in := range listInstances(t, nsName, "camera") {
		if in.DeviceID != uuid {
			t.Errorf("Instance of device %s, want %s", in.DeviceID, uuid)
		}
	}
}

func describe(e eventsv1.Event) string {
	return fmt.Sprintf("%s/%s %s %s", e.Regarding.Kind, e.Regarding.Name, e.Reason, e.Note)
}
