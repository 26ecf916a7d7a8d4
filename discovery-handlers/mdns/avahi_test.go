package mdns_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/discovery-handlers/mdns"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/avahi"
)

const wait = 20 * time.Second

func waitFor(t *testing.T, s *handlertest.Stream, want ...string) []*discoveryv1.Device {
	t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(wait)
	for {
		devs := s.Next(t, time.Until(deadline))
		got := handlertest.IDs(devs)
		if slices.Equal(got, want) || (len(got) == 0 && len(want) == 0) {
			return devs
		}
		t.Logf("devices %q, waiting for %q", got, want)
	}
}

// TestAvahi runs the real dowse-mdns-discovery binary in a network
// namespace linked to another where Debian's avahi-daemon publishes
// printers: the one whose TXT record passes the filter appears with its
// host, port, address and TXT entries; one published later appears; one
// withdrawn (avahi's goodbye) goes; another whose TXT fails the filter
// never appears. It reports the handler's peak RSS.
func TestAvahi(t *testing.T) {
	l := avahi.NewLink(t)
	office := avahi.Service{Name: "Office printer", Type: "_ipp._tcp", Port: 631, TXT: []string{"txtvers=1", "ty=Acme Laser 9", "rp=ipp/print", "Color=T"}}
	lab := avahi.Service{Name: "Lab printer", Type: "_ipp._tcp", Port: 632, TXT: []string{"ty=Other Brand"}}
	web := avahi.Service{Name: "Office printer", Type: "_http._tcp", Port: 80}
	d := avahi.Start(t, l, "printhost", office, lab, web)

	p, reg := startHandler(t, l)
	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(
		`{"serviceTypes": ["_ipp._tcp"], "txt": {"ty": "^Acme"}, "interfaces": [%q], "queryInterval": "5s"}`, l.TestIf)})
	start := time.Now()
	devs := waitFor(t, s, "Office\\ printer._ipp._tcp.local")
	t.Logf("FIGURE: mDNS: the first matching service found %v after the stream opened", time.Since(start).Round(time.Millisecond))
	want := map[string]string{mdns.InstanceProperty: "Office printer", mdns.ServiceProperty: "_ipp._tcp", mdns.HostProperty: "printhost.local",
		mdns.PortProperty: "631", mdns.AddressProperty: l.PeerAddr, "MDNS_TXT_TY": "Acme Laser 9", "MDNS_TXT_RP": "ipp/print", "MDNS_TXT_COLOR": "T", "MDNS_TXT_TXTVERS": "1"}
	for k, v := range want {
		if got := devs[0].GetProperties()[k]; got != v {
			t.Errorf("%s = %q, want %q (all: %v)", k, got, v, devs[0].GetProperties())
		}
	}

	hall := avahi.Service{Name: "Hall printer", Type: "_ipp._tcp", Port: 631, TXT: []string{"ty=Acme Ink 2"}}
	d.Publish(hall)
	waitFor(t, s, "Office\\ printer._ipp._tcp.local", "Hall\\ printer._ipp._tcp.local")

	withdrawn := time.Now()
	d.Withdraw(office)
	waitFor(t, s, "Hall\\ printer._ipp._tcp.local")
	t.Logf("FIGURE: mDNS: a withdrawn service (goodbye) gone %v after avahi-daemon was told", time.Since(withdrawn).Round(time.Millisecond))

	// The daemon stops: its goodbyes end every service.
	d.Stop()
	waitFor(t, s)

	hwm, err := procs.PeakRSSOf(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE: dowse-mdns-discovery peak RSS: %.1f MiB", float64(hwm)/1024)
}

// startHandler runs the real dowse-mdns-discovery binary in l's test
// namespace, registered with an agent of the test's, and returns it and its
// registration.
func startHandler(t *testing.T, l *avahi.Link) (*procs.Proc, *discoveryv1.RegisterDiscoveryHandlerRequest) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dowse-mdns-discovery")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/dowse-mdns-discovery").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	out := procs.NewLines()
	p, err := procs.Run("dowse-mdns-discovery", "ip", []string{"netns", "exec", l.TestNS, bin, "--state-dir", dir}, procs.Options{Stdout: out, Stderr: out, DieWithCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.StopWithin(5 * time.Second)
		t.Logf("handler's output:\n%s", out)
	})
	reg := agent.WaitForRegistration(t, wait)
	if reg.GetName() != mdns.DefaultName || !reg.GetShared() {
		t.Errorf("registration %v", reg)
	}
	return p, reg
}

// TestAvahiIPv6 browses a link that has no IPv4 at all, where avahi-daemon
// speaks mDNS over IPv6 only (group ff02::fb): the service is found, its
// address is the peer's IPv6 address, and the daemon's stop removes it. Over IPv4 only (ipFamilies) the
// handler refuses the interface, which has no IPv4 address.
func TestAvahiIPv6(t *testing.T) {
	l := avahi.NewIPv6Link(t)
	sensor := avahi.Service{Name: "Boiler sensor", Type: "_http._tcp", Port: 8080, TXT: []string{"model=BX-2"}}
	d := avahi.Start(t, l, "boiler", sensor)
	_, reg := startHandler(t, l)

	refused := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(
		`{"serviceTypes": ["_http._tcp"], "interfaces": [%q], "ipFamilies": ["IPv4"]}`, l.TestIf)})
	if err := refused.Err(t, wait); err == nil || !strings.Contains(err.Error(), "no address of the families browsed") {
		t.Errorf("IPv4 only on an IPv6-only link: %v, want an error saying the interface has no IPv4 address", err)
	}

	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(
		`{"serviceTypes": ["_http._tcp"], "interfaces": [%q], "queryInterval": "5s"}`, l.TestIf)})
	start := time.Now()
	devs := waitFor(t, s, "Boiler\\ sensor._http._tcp.local")
	t.Logf("FIGURE: mDNS over IPv6: the service found %v after the stream opened", time.Since(start).Round(time.Millisecond))
	props := devs[0].GetProperties()
	if props[mdns.AddressProperty] != l.PeerAddr || props[mdns.PortProperty] != "8080" || props["MDNS_TXT_MODEL"] != "BX-2" {
		t.Errorf("properties %v, want address %s, port 8080, model BX-2", props, l.PeerAddr)
	}
	d.Stop()
	waitFor(t, s)
}
