package snmp_test

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dowse-dev/dowse/discovery-handlers/snmp"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/peers/snmpd"
)

const wait = 15 * time.Second

func runHandler(t *testing.T) string {
	t.Helper()
	cfg := snmp.Handler()
	cfg.Logger = testr.New(t)
	reg := handlertest.Run(t, cfg)
	if reg.GetName() != snmp.DefaultName || !reg.GetShared() {
		t.Errorf("registration = %v, want name %s, shared", reg, snmp.DefaultName)
	}
	return reg.GetEndpoint()
}

// waitFor waits for a device list of exactly want (ids) and returns the
// response that carried it.
func waitFor(t *testing.T, s *handlertest.Stream, want ...string) *discoveryv1.DiscoverResponse {
	t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(wait)
	for {
		resp := s.NextResponse(t, time.Until(deadline))
		got := handlertest.IDs(resp.GetDevices())
		if slices.Equal(got, want) || (len(got) == 0 && len(want) == 0) {
			return resp
		}
		t.Logf("devices %q, waiting for %q", got, want)
	}
}

// waitSkipped returns the message under which the stream's latest response
// (seen, if it has been read already, or the next ones) skips candidate as
// reason, waiting for one that does. The handler sends a list only when it
// changes, so a skip the seen response carried may come no more.
func waitSkipped(t *testing.T, s *handlertest.Stream, seen *discoveryv1.DiscoverResponse, reason, candidate string) string {
	t.Helper()
	deadline := time.Now().Add(wait)
	for resp := seen; ; resp = s.NextResponse(t, time.Until(deadline)) {
		for _, r := range resp.GetSkipped() {
			if r.GetReason() != reason {
				continue
			}
			for _, c := range r.GetCandidates() {
				if c.GetCandidate() == candidate {
					return c.GetMessage()
				}
			}
		}
		if resp != nil {
			t.Logf("skipped %v, waiting for %s %s", resp.GetSkipped(), reason, candidate)
		}
	}
}

// junkPeer answers every UDP datagram on host:port with bytes that are not
// SNMP: a device that lies.
func junkPeer(t *testing.T, host string, port int) string {
	t.Helper()
	c, err := net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			// A BER SEQUENCE header that claims more than follows, then
			// text.
			_, _ = c.WriteTo(append([]byte{0x30, 0x82, 0x7f, 0xff, 0x02, 0x01}, "HTTP/1.1 400 Bad Request\r\n"...), from)
		}
	})
	t.Cleanup(func() { c.Close(); wg.Wait() })
	return c.LocalAddr().String()
}

const (
	netSNMPLinux = ".1.3.6.1.4.1.8072.3.2.10"
	apcUPS       = ".1.3.6.1.4.1.318.1.3.27"
)

// TestSNMPPeers runs every scenario against Debian's snmpd agents in a
// network namespace the test makes, each on an address of its own and
// SNMP's port, reached over a veth pair from the handler's side, whose
// address answers junk.
func TestSNMPPeers(t *testing.T) {
	endpoint := runHandler(t)
	network := snmpd.NewNetwork(t)
	// net-snmp itself, and one that says it is an APC UPS.
	linux := snmpd.Start(t, snmpd.Config{Network: network, SysDescr: "Linux pump-7 6.1.0 x86_64", SysObjectID: netSNMPLinux, SysName: "pump-7"})
	ups := snmpd.Start(t, snmpd.Config{Network: network, SysDescr: "APC Web/SNMP Management Card", SysObjectID: apcUPS, SysName: "ups-3"})
	// v3 only, in effect: its community is not the default one.
	v3 := snmpd.Start(t, snmpd.Config{Network: network, ROCommunity: "not-public", SysDescr: "Linux secure 6.1.0", SysObjectID: netSNMPLinux, SysName: "secure",
		Users: []snmpd.User{{Name: "dowse", AuthProto: "SHA", AuthPass: "auth-pass-1", PrivProto: "AES", PrivPass: "priv-pass-1"}}})
	port := linux.Port
	junk := junkPeer(t, network.HostAddr, port)
	// The agents and the junk peer are in the first eight addresses.
	firstEight := netip.PrefixFrom(network.Prefix.Addr(), 29).String()

	discover := func(details string, props map[string]string) *handlertest.Stream {
		req := &discoveryv1.DiscoverRequest{DiscoveryDetails: details, DiscoveryProperties: map[string]*discoveryv1.ByteData{}}
		for k, v := range props {
			req.DiscoveryProperties[k] = &discoveryv1.ByteData{Vec: []byte(v)}
		}
		return handlertest.Discover(t, endpoint, req)
	}
	rangeDetails := func(extra string) string {
		return fmt.Sprintf(`{"targets": [%q], "timeout": "300ms", "rescanInterval": "200ms", "packetsPerSecond": 500 %s}`, firstEight, extra)
	}

	t.Run("a range: agents found with their system group, junk and silence skipped", func(t *testing.T) {
		s := discover(rangeDetails(""), nil)
		resp := waitFor(t, s, linux.Addr(), ups.Addr())
		for _, dev := range resp.GetDevices() {
			p := dev.GetProperties()
			want := map[string]string{snmp.AddressProperty: linux.Host, snmp.PortProperty: strconv.Itoa(port), snmp.VersionProperty: "v2c",
				snmp.SysObjectIDProperty: netSNMPLinux, snmp.SysDescrProperty: "Linux pump-7 6.1.0 x86_64", snmp.SysNameProperty: "pump-7"}
			if dev.GetId() == ups.Addr() {
				want[snmp.AddressProperty], want[snmp.SysObjectIDProperty], want[snmp.SysDescrProperty], want[snmp.SysNameProperty] = ups.Host, apcUPS, "APC Web/SNMP Management Card", "ups-3"
			}
			for k, v := range want {
				if p[k] != v {
					t.Errorf("%s: %s = %q, want %q (all: %v)", dev.GetId(), k, p[k], v, p)
				}
			}
		}
		// The junk peer is skipped as garbage, the v3 agent (another
		// community) as silent.
		msg := waitSkipped(t, s, resp, snmp.SkipGarbage, junk)
		t.Logf("junk peer: %s", msg)
		msg = waitSkipped(t, s, resp, snmp.SkipNoReply, v3.Addr())
		if !strings.Contains(msg, "community") {
			t.Errorf("silent v2c agent: %q, want a word on communities", msg)
		}
	})

	t.Run("match on sysObjectID prefix and sysDescr", func(t *testing.T) {
		waitFor(t, discover(rangeDetails(`, "match": {"sysObjectIdPrefixes": ["1.3.6.1.4.1.8072"]}`), nil), linux.Addr())
		waitFor(t, discover(rangeDetails(`, "match": {"sysObjectIdPrefixes": [".1.3.6.1.4.1.318"], "sysDescr": "^APC"}`), nil), ups.Addr())
		waitFor(t, discover(rangeDetails(`, "match": {"sysName": "^(pump|ups)-"}`), nil), linux.Addr(), ups.Addr())
		// A prefix must match whole arcs: .1.3.6.1.4.1.31 is not .1.3.6.1.4.1.318's parent.
		s := discover(rangeDetails(`, "match": {"sysObjectIdPrefixes": [".1.3.6.1.4.1.31"]}`), nil)
		msg := waitSkipped(t, s, waitFor(t, s), snmp.SkipNoMatch, ups.Addr())
		t.Logf("a non-matching prefix: %s", msg)
		s = discover(rangeDetails(`, "match": {"sysDescr": "^Cisco IOS"}`), nil)
		waitSkipped(t, s, waitFor(t, s), snmp.SkipNoMatch, linux.Addr())
	})

	t.Run("v3 with the user from the properties", func(t *testing.T) {
		creds := map[string]string{snmp.UserProperty: "dowse", snmp.AuthPassphraseProperty: "auth-pass-1", snmp.PrivPassphraseProperty: "priv-pass-1"}
		s := discover(fmt.Sprintf(`{"targets": [%q], "version": "v3", "v3": {"authProtocol": "SHA", "privProtocol": "AES"}, "rescanInterval": "200ms"}`, v3.Addr()), creds)
		dev := waitFor(t, s, v3.Addr()).GetDevices()[0]
		if p := dev.GetProperties(); p[snmp.VersionProperty] != "v3" || p[snmp.SysNameProperty] != "secure" {
			t.Errorf("properties = %v", p)
		}
		for name, wrong := range map[string]map[string]string{
			"wrong auth passphrase": {snmp.UserProperty: "dowse", snmp.AuthPassphraseProperty: "auth-pass-2", snmp.PrivPassphraseProperty: "priv-pass-1"},
			"unknown user":          {snmp.UserProperty: "mallory", snmp.AuthPassphraseProperty: "auth-pass-1", snmp.PrivPassphraseProperty: "priv-pass-1"},
		} {
			s := discover(fmt.Sprintf(`{"targets": [%q], "version": "v3", "rescanInterval": "200ms"}`, v3.Addr()), wrong)
			msg := waitSkipped(t, s, nil, snmp.SkipAuthRefused, v3.Addr())
			t.Logf("%s: %s", name, msg)
			if !strings.Contains(msg, "refused the credentials") {
				t.Errorf("%s: %q", name, msg)
			}
		}
		// Settings that cannot work are refused before any packet.
		err := discover(fmt.Sprintf(`{"targets": [%q], "version": "v3"}`, v3.Addr()), map[string]string{snmp.UserProperty: "dowse", snmp.AuthPassphraseProperty: "short"}).Err(t, wait)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "8 characters") {
			t.Errorf("a short passphrase: %v, want InvalidArgument", err)
		}
		t.Logf("a short passphrase: %v", status.Convert(err).Message())
		err = discover(fmt.Sprintf(`{"targets": [%q]}`, v3.Addr()), map[string]string{snmp.UserProperty: "dowse"}).Err(t, wait)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "version: v3") {
			t.Errorf("a user with v2c: %v, want InvalidArgument", err)
		}
	})

	t.Run("junk does not stop the handler; an agent that goes away and comes back", func(t *testing.T) {
		const interval, threshold = 200 * time.Millisecond, 3
		s := discover(fmt.Sprintf(`{"targets": [%q, %q, %q], "timeout": "300ms", "rescanInterval": %q, "failureThreshold": %d}`,
			junk, linux.Addr(), ups.Addr(), interval, threshold), nil)
		waitFor(t, s, linux.Addr(), ups.Addr())
		stopped := time.Now()
		ups.Stop()
		waitFor(t, s, linux.Addr())
		if took, least := time.Since(stopped), time.Duration(threshold-1)*interval; took < least {
			t.Errorf("dropped %v after the agent stopped, want at least %v (%d rounds %v apart)", took, least, threshold, interval)
		}
		ups.Restart(t)
		waitFor(t, s, linux.Addr(), ups.Addr())
	})

	t.Run("a /24 at the defaults", func(t *testing.T) {
		// Five agents answering v2c, the v3-only one, the junk peer and
		// silence everywhere else; the default rate (50 packets/s),
		// timeout and port: 254 probes.
		more := []*snmpd.Agent{linux, ups}
		for i := range 3 {
			more = append(more, snmpd.Start(t, snmpd.Config{Network: network, SysDescr: "Linux sensor 6.1.0", SysObjectID: netSNMPLinux, SysName: fmt.Sprintf("sensor-%d", i)}))
		}
		want := make([]string, 0, len(more))
		for _, a := range more {
			want = append(want, a.Addr())
		}
		slices.Sort(want)
		start := time.Now()
		s := discover(fmt.Sprintf(`{"targets": [%q]}`, network.Prefix), nil)
		devs := s.Next(t, 30*time.Second)
		took := time.Since(start)
		if got := handlertest.IDs(devs); !slices.Equal(got, want) {
			t.Errorf("first list %q, want %q", got, want)
		}
		t.Logf("FIGURE: SNMP sweep of a /24 (254 targets, default %d packets/s, timeout %v) in a network namespace with five agents, a v3-only one and a junk peer: %v",
			snmp.DefaultPacketsPerSecond, snmp.DefaultTimeout, took.Round(time.Millisecond))
		if least := 253 * time.Second / snmp.DefaultPacketsPerSecond; took < least {
			t.Errorf("254 probes took %v, faster than %d packets/s allows (%v)", took, snmp.DefaultPacketsPerSecond, least)
		}
	})

	t.Run("bad details", func(t *testing.T) {
		for details, field := range map[string]string{
			`{"targets": ["127.0.0.0/16"]}`:                                       "targets[0]",
			`{"targets": ["127.0.0.1"], "match": {"sysObjectIdPrefixes": ["x"]}}`: "match.sysObjectIdPrefixes[0]",
			`{"targets": ["127.0.0.1"], "match": {"sysDescr": "("}}`:              "match.sysDescr",
			`{"targets": ["127.0.0.1"], "version": "v4"}`:                         "version",
			`{"targets": ["127.0.0.1"], "packetsPerSecond": 5000}`:                "packetsPerSecond",
			`{"targets": ["127.0.0.1"], "comunity": "x"}`:                         "comunity",
		} {
			err := discover(details, nil).Err(t, wait)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), field) {
				t.Errorf("%s: stream error = %v, want InvalidArgument naming %s", details, err, field)
			}
		}
	})
}
