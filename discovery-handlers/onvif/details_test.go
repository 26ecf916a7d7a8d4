package onvif

import (
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dowse-dev/dowse/discovery-handlers/onvif/wsdiscovery"
)

func TestParseDetailsDefaults(t *testing.T) {
	d, err := ParseDetails(``)
	if err != nil {
		t.Fatal(err)
	}
	if d.Timeout() != DefaultDiscoveryTimeout || d.Interval() != DefaultProbeInterval || d.FailureThreshold != DefaultFailureThreshold {
		t.Errorf("defaults %+v", d)
	}
	if ty := d.Types(); len(ty) != 2 || ty[0] != wsdiscovery.TypeNetworkVideoTransmitter || ty[1] != wsdiscovery.TypeONVIFDevice {
		t.Errorf("types %v", ty)
	}
}

func TestParseDetailsFilters(t *testing.T) {
	d, err := ParseDetails(`
ipAddresses: {action: Exclude, items: ["10.0.0.0/24", "192.168.1.7"]}
macAddresses: {items: ["C0-56-E3-A1-B2-C3"]}
scopes: {action: Include, items: ["onvif://www.onvif.org/location/*", "onvif://www.onvif.org/name/gate"]}
uuids: {action: Exclude, items: ["urn:uuid:4D454930-3030-3030-3030-C056E3A1B2C3"]}
discoveryTimeoutSeconds: 3
probeInterval: 5s
interfaces: [eth0]
probeTypes: ["wsdp:Device"]
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		want bool
	}{{"10.0.0.9", false}, {"192.168.1.7", false}, {"192.168.1.8", true}, {"::ffff:10.0.0.1", false}} {
		if got := d.passesAddress(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("address %s passes = %v", tc.addr, got)
		}
	}
	if d.passesUUID("urn:uuid:4d454930-3030-3030-3030-c056e3a1b2c3") || !d.passesUUID("urn:uuid:00000000-3030-3030-3030-c056e3a1b2c3") {
		t.Error("uuid filter")
	}
	if !d.passesScopes([]string{"onvif://www.onvif.org/location/berlin"}) || !d.passesScopes([]string{"x", "onvif://www.onvif.org/name/gate"}) ||
		d.passesScopes([]string{"onvif://www.onvif.org/name/gate2"}) || d.passesScopes(nil) {
		t.Error("scope filter")
	}
	if !d.passesMACs([]string{"c0:56:e3:a1:b2:c3"}) || d.passesMACs([]string{"c0:56:e3:a1:b2:c4"}) || d.passesMACs(nil) {
		t.Error("mac filter")
	}
	if d.Timeout().Seconds() != 3 || d.Interval().Seconds() != 5 || d.Types()[0] != wsdiscovery.TypeDevProfDevice {
		t.Errorf("parsed %+v", d)
	}
}

func TestParseDetailsErrors(t *testing.T) {
	for _, tc := range []struct{ details, want string }{
		{`ipAdresses: {items: [1.2.3.4]}`, "ipAdresses"},
		{`ipAddresses: {action: include, items: [1.2.3.4]}`, `ipAddresses.action: "include"`},
		{`ipAddresses: {action: Include}`, "ipAddresses.items: at least one"},
		{`ipAddresses: {items: ["1.2.3.4", "1.2.3"]}`, `ipAddresses.items[1]: "1.2.3"`},
		{`macAddresses: {items: ["c0:56:e3:a1:b2"]}`, `macAddresses.items[0]`},
		{`uuids: {items: ["not-a-uuid"]}`, `uuids.items[0]`},
		{`scopes: {items: ["a b"]}`, `scopes.items[0]`},
		{`discoveryTimeoutSeconds: 61`, "discoveryTimeoutSeconds: 61"},
		{`discoveryTimeoutSeconds: -1`, "discoveryTimeoutSeconds: -1"},
		{`probeInterval: 10`, `probeInterval: "10"`},
		{`probeInterval: 100ms`, "probeInterval: 100ms is shorter"},
		{`failureThreshold: 101`, "failureThreshold: 101"},
		{`interfaces: ["a/b"]`, `interfaces[0]`},
		{`probeTypes: ["NetworkVideoTransmitter"]`, `probeTypes[0]`},
		{`probeTypes: ["dn:NetworkVideoTransmitter", "xx:Device"]`, `probeTypes[1]`},
	} {
		_, err := ParseDetails(tc.details)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseDetails(%q) = %v, want InvalidArgument naming %q", tc.details, err, tc.want)
		}
	}
}

func TestPickXAddr(t *testing.T) {
	from := netip.MustParseAddr("10.1.1.5")
	for _, tc := range []struct {
		xaddrs []string
		want   string
		ok     bool
	}{
		{[]string{"http://10.1.1.5/onvif/device_service"}, "http://10.1.1.5/onvif/device_service", true},
		{[]string{"http://192.168.0.1/onvif/device_service", "http://10.1.1.5:8080/onvif/device_service"}, "http://10.1.1.5:8080/onvif/device_service", true},
		{[]string{"http://camera.local/x", "http://192.168.0.1/x"}, "http://192.168.0.1/x", true},
		{[]string{"ftp://10.1.1.5/x", "::::"}, "", false},
		{nil, "", false},
	} {
		f := wsdiscovery.Found{Target: wsdiscovery.Target{XAddrs: tc.xaddrs}, From: from}
		got, _, ok := pickXAddr(f)
		if got != tc.want || ok != tc.ok {
			t.Errorf("pickXAddr(%q) = %q, %v", tc.xaddrs, got, ok)
		}
	}
}
