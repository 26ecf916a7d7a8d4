package snmp

import (
	"slices"
	"strings"
	"testing"

	"github.com/gosnmp/gosnmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dowse-dev/dowse/internal/snmpclient"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

func TestParseDetails(t *testing.T) {
	for _, tc := range []struct {
		name    string
		details string
		check   func(*testing.T, *Details)
		wantErr string // part of the InvalidArgument message; "" for success
	}{
		{name: "defaults", details: `targets: [ups1]`, check: func(t *testing.T, d *Details) {
			if !slices.Equal(d.AddressList(), []string{"ups1:161"}) || d.Version != snmpclient.V2c || d.ProbeTimeout() != DefaultTimeout ||
				d.Interval() != DefaultRescanInterval || d.Concurrency != DefaultPacketsPerSecond+1 || d.PacketsPerSecond != DefaultPacketsPerSecond ||
				d.FailureThreshold != DefaultFailureThreshold || d.MaxTargets != DefaultMaxTargets {
				t.Errorf("defaults = %+v", d)
			}
		}},
		{name: "host:port, ports, IPv6, duplicates", details: `{"targets": ["10.0.0.1:1161", "h", "[fd00::1]:161", "fd00::2", "10.0.0.1:1161"], "ports": [161, 1161]}`,
			check: func(t *testing.T, d *Details) {
				want := []string{"10.0.0.1:1161", "h:161", "h:1161", "[fd00::1]:161", "[fd00::2]:161", "[fd00::2]:1161"}
				if !slices.Equal(d.AddressList(), want) {
					t.Errorf("targets = %q, want %q", d.AddressList(), want)
				}
			}},
		{name: "CIDR /24", details: `targets: [10.1.2.0/24]`, check: func(t *testing.T, d *Details) {
			l := d.AddressList()
			if len(l) != 254 || l[0] != "10.1.2.1:161" || l[253] != "10.1.2.254:161" {
				t.Errorf("got %d targets from %q to %q, want 254 from .1 to .254", len(l), l[0], l[len(l)-1])
			}
		}},
		{name: "match", details: `{"targets": ["h"], "match": {"sysObjectIdPrefixes": ["1.3.6.1.4.1.318", ".1.3.6.1.4.1.8072."], "sysDescr": "^APC", "sysName": "ups"}}`,
			check: func(t *testing.T, d *Details) {
				if !slices.Equal(d.prefixes, []string{".1.3.6.1.4.1.318", ".1.3.6.1.4.1.8072"}) {
					t.Errorf("prefixes = %q", d.prefixes)
				}
				for _, c := range []struct {
					a  agentInfo
					ok bool
				}{
					{agentInfo{objectID: ".1.3.6.1.4.1.318.1.3.27", descr: "APC Web/SNMP", name: "ups-3"}, true},
					{agentInfo{objectID: ".1.3.6.1.4.1.3180.1", descr: "APC Web/SNMP", name: "ups-3"}, false},
					{agentInfo{objectID: ".1.3.6.1.4.1.318", descr: "APC", name: "ups"}, true},
					{agentInfo{objectID: ".1.3.6.1.4.1.318.1", descr: "Eaton", name: "ups"}, false},
					{agentInfo{objectID: ".1.3.6.1.4.1.318.1", descr: "APC", name: "pump"}, false},
				} {
					if ok, why := d.matches(c.a); ok != c.ok {
						t.Errorf("matches(%+v) = %v (%s), want %v", c.a, ok, why, c.ok)
					}
				}
			}},
		{name: "no targets", details: `{}`, wantErr: "targets: at least one"},
		{name: "range over maxTargets", details: `{"targets": ["10.0.0.0/16"]}`, wantErr: "targets[0]: 10.0.0.0/16 on 1 port(s) brings the targets to 65534"},
		{name: "ranges over maxTargets together", details: `{"targets": ["10.0.0.0/24", "10.0.1.0/24"], "ports": [161, 1161], "maxTargets": 600}`, wantErr: "targets[1]"},
		{name: "a /7", details: `{"targets": ["10.0.0.0/7"], "maxTargets": 65536}`, wantErr: "2^25"},
		{name: "bad port", details: `{"targets": ["h:0"]}`, wantErr: "not a UDP port"},
		{name: "bad ports", details: `{"targets": ["h"], "ports": [70000]}`, wantErr: "ports[0]"},
		{name: "unknown field", details: `{"targets": ["h"], "community": "x"}`, wantErr: "unknown field \"community\""},
		{name: "version", details: `{"targets": ["h"], "version": "v2"}`, wantErr: "version"},
		{name: "bad prefix", details: `{"targets": ["h"], "match": {"sysObjectIdPrefixes": ["1.3.x"]}}`, wantErr: "match.sysObjectIdPrefixes[0]"},
		{name: "bad regexp", details: `{"targets": ["h"], "match": {"sysName": "a("}}`, wantErr: "match.sysName"},
		{name: "timeout", details: `{"targets": ["h"], "timeout": "1ms"}`, wantErr: "timeout"},
		{name: "rate", details: `{"targets": ["h"], "packetsPerSecond": -1}`, wantErr: "packetsPerSecond"},
		{name: "concurrency", details: `{"targets": ["h"], "concurrency": 1000}`, wantErr: "concurrency"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ParseDetails(tc.details)
			if tc.wantErr != "" {
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want InvalidArgument containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, d)
		})
	}
}

func TestSecurity(t *testing.T) {
	props := func(kv ...string) map[string]*discoveryv1.ByteData {
		m := map[string]*discoveryv1.ByteData{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = &discoveryv1.ByteData{Vec: []byte(kv[i+1])}
		}
		return m
	}
	for _, tc := range []struct {
		name, details string
		props         map[string]*discoveryv1.ByteData
		want          snmpclient.Security
		wantErr       string
	}{
		{name: "v2c default community", details: `targets: [h]`, want: snmpclient.Security{Version: "v2c", Community: "public"}},
		{name: "v2c community from a Secret", details: `targets: [h]`, props: props(CommunityProperty, "s3cret"), want: snmpclient.Security{Version: "v2c", Community: "s3cret"}},
		{name: "v1", details: `{targets: [h], version: "1"}`, want: snmpclient.Security{Version: "v1", Community: "public"}},
		{name: "v3 authPriv by default", details: `{targets: [h], version: v3}`,
			props: props(UserProperty, "u", AuthPassphraseProperty, "12345678", PrivPassphraseProperty, "abcdefgh"),
			want:  snmpclient.Security{Version: "v3", User: "u", Level: "authPriv", AuthProtocol: "SHA", PrivProtocol: "AES", AuthPassphrase: "12345678", PrivPassphrase: "abcdefgh"}},
		{name: "v3 authNoPriv, SHA-256", details: `{targets: [h], version: v3, v3: {authProtocol: sha-256, contextName: c}}`,
			props: props(UserProperty, "u", AuthPassphraseProperty, "12345678"),
			want:  snmpclient.Security{Version: "v3", User: "u", Level: "authNoPriv", AuthProtocol: "SHA256", AuthPassphrase: "12345678", ContextName: "c"}},
		{name: "v3 noAuthNoPriv", details: `{targets: [h], version: v3}`, props: props(UserProperty, "u"),
			want: snmpclient.Security{Version: "v3", User: "u", Level: "noAuthNoPriv"}},
		{name: "v3 without a user", details: `{targets: [h], version: v3}`, wantErr: "needs a user"},
		{name: "v3 level without its passphrase", details: `{targets: [h], version: v3, v3: {securityLevel: authPriv}}`,
			props: props(UserProperty, "u", AuthPassphraseProperty, "12345678"), wantErr: "privacy passphrase"},
		{name: "v3 bad protocol", details: `{targets: [h], version: v3, v3: {privProtocol: 3DES}}`,
			props: props(UserProperty, "u", AuthPassphraseProperty, "12345678", PrivPassphraseProperty, "abcdefgh"), wantErr: "privProtocol"},
		{name: "v3 settings without v3", details: `{targets: [h], v3: {authProtocol: SHA}}`, wantErr: "v3: set, but version"},
		{name: "a community with v3", details: `{targets: [h], version: v3}`, props: props(UserProperty, "u", CommunityProperty, "public"), wantErr: "community"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ParseDetails(tc.details)
			if err != nil {
				t.Fatal(err)
			}
			s, err := d.Security(tc.props)
			if tc.wantErr != "" {
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want InvalidArgument containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *s != tc.want {
				t.Errorf("security = %+v, want %+v", *s, tc.want)
			}
		})
	}
}

func TestReadAnswer(t *testing.T) {
	decode := func(b []byte) (agentInfo, error) {
		var a agentInfo
		err := snmpclient.Do(func() error {
			pkt, err := (&gosnmp.GoSNMP{Version: gosnmp.Version2c}).SnmpDecodePacket(b)
			if err != nil {
				return err
			}
			a, err = readAnswer(pkt)
			return err
		})
		return a, err
	}
	a, err := decode(answerBytes(t, false))
	if err != nil || a != (agentInfo{descr: "Linux pump-7", objectID: ".1.3.6.1.4.1.8072.3.2.10", name: "pump-7"}) {
		t.Errorf("a full answer: %+v, %v", a, err)
	}
	if a, err = decode(answerBytes(t, true)); err != nil || a.name != "" || a.descr == "" {
		t.Errorf("an answer without sysName: %+v, %v", a, err)
	}
	long := strings.Repeat("é", 300) + "\x00\x1b[2J"
	pkt := &gosnmp.SnmpPacket{PDUType: gosnmp.GetResponse, Variables: []gosnmp.SnmpPDU{
		{Name: oidSysDescr, Type: gosnmp.OctetString, Value: []byte(long)},
		{Name: oidSysObjectID, Type: gosnmp.ObjectIdentifier, Value: "1.3.6.1.4.1.1"},
		{Name: oidSysName, Type: gosnmp.OctetString, Value: []byte("a\x00b\xffc")},
	}}
	if a, err = readAnswer(pkt); err != nil || len(a.descr) > snmpclient.MaxText || a.name != "a\uFFFDb\uFFFDc" || a.objectID != ".1.3.6.1.4.1.1" {
		t.Errorf("bounded values: %q (%d bytes) %q %q, %v", a.descr, len(a.descr), a.name, a.objectID, err)
	}
	for name, vars := range map[string][]gosnmp.SnmpPDU{
		"no sysObjectID":         {{Name: oidSysDescr, Type: gosnmp.OctetString, Value: []byte("x")}},
		"sysDescr not text":      {{Name: oidSysDescr, Type: gosnmp.Integer, Value: 1}, {Name: oidSysObjectID, Type: gosnmp.ObjectIdentifier, Value: ".1.3"}},
		"sysObjectID not an OID": {{Name: oidSysDescr, Type: gosnmp.OctetString, Value: []byte("x")}, {Name: oidSysObjectID, Type: gosnmp.OctetString, Value: []byte("1.3")}},
	} {
		if _, err := readAnswer(&gosnmp.SnmpPacket{PDUType: gosnmp.GetResponse, Variables: vars}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := readAnswer(&gosnmp.SnmpPacket{PDUType: gosnmp.GetResponse, Error: gosnmp.NoSuchName}); err == nil {
		t.Error("an error status: no error")
	}
}
