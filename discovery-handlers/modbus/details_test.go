package modbus

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestParseDetails(t *testing.T) {
	for _, tc := range []struct {
		name    string
		details string
		check   func(*testing.T, *Details)
		wantErr string // part of the InvalidArgument message; "" for success
	}{
		{name: "defaults", details: `targets: [plc1]`, check: func(t *testing.T, d *Details) {
			if !slices.Equal(d.AddressList(), []string{"plc1:502"}) || !slices.Equal(d.UnitIDs, []int{1}) || d.Probe.Function != HoldingRegisters ||
				d.Probe.Count != 1 || d.ProbeTimeout() != DefaultTimeout || d.Interval() != DefaultRescanInterval || d.Concurrency != DefaultProbesPerSecond+1 ||
				d.ProbesPerSecond != DefaultProbesPerSecond || d.FailureThreshold != DefaultFailureThreshold || d.MaxTargets != DefaultMaxTargets {
				t.Errorf("defaults = %+v", d)
			}
		}},
		{name: "host:port, ports, IPv6, duplicates", details: `{"targets": ["10.0.0.1:5020", "h", "[fd00::1]:502", "fd00::2", "10.0.0.1:5020"], "ports": [502, 503]}`,
			check: func(t *testing.T, d *Details) {
				want := []string{"10.0.0.1:5020", "h:502", "h:503", "[fd00::1]:502", "[fd00::2]:502", "[fd00::2]:503"}
				if !slices.Equal(d.AddressList(), want) {
					t.Errorf("targets = %q, want %q", d.AddressList(), want)
				}
			}},
		{name: "CIDR /24", details: `targets: [127.0.0.0/24]`, check: func(t *testing.T, d *Details) {
			l := d.AddressList()
			if len(l) != 254 || l[0] != "127.0.0.1:502" || l[253] != "127.0.0.254:502" {
				t.Errorf("got %d targets from %q to %q, want 254 from 127.0.0.1 to .254", len(l), l[0], l[len(l)-1])
			}
		}},
		{name: "CIDR /32 and /31", details: `{"targets": ["127.0.0.9/32", "127.0.0.10/31"], "ports": [1]}`, check: func(t *testing.T, d *Details) {
			if want := []string{"127.0.0.9:1", "127.0.0.10:1", "127.0.0.11:1"}; !slices.Equal(d.AddressList(), want) {
				t.Errorf("targets = %q, want %q", d.AddressList(), want)
			}
		}},
		{name: "everything", details: `{"targets": ["a:1"], "unitIds": [0, 3, 255], "probe": {"function": "inputRegisters", "address": 100, "count": 4, "identify": true, "serialObjectId": 128},
			"match": {"registers": [{"offset": 3, "min": 1, "max": 9}], "identification": {"vendorName": "^Acme", "serialNumber": "."}},
			"timeout": "250ms", "concurrency": 4, "probesPerSecond": 10, "rescanInterval": "5s", "failureThreshold": 3, "maxTargets": 10}`,
			check: func(t *testing.T, d *Details) {
				if d.ProbeTimeout() != 250*time.Millisecond || d.Interval() != 5*time.Second || d.idMatch[0] == nil || d.serialRe == nil || !d.Match.Registers[0].accepts(5) || d.Match.Registers[0].accepts(10) {
					t.Errorf("parsed = %+v", d)
				}
			}},
		{name: "unknown field", details: `{"targets": ["a"], "unitId": 3}`, wantErr: `"unitId"`},
		{name: "unknown probe field", details: `{"targets": ["a"], "probe": {"register": 3}}`, wantErr: `"register"`},
		{name: "bad YAML", details: `targets: [`, wantErr: "discovery_details"},
		{name: "no targets", details: `unitIds: [1]`, wantErr: "targets: at least one"},
		{name: "empty target", details: `targets: [a, " "]`, wantErr: "targets[1]: must not be empty"},
		{name: "bad CIDR", details: `targets: [a, 10.0.0.0/33]`, wantErr: "targets[1]"},
		{name: "bad port in target", details: `targets: ["a:http"]`, wantErr: "targets[0]"},
		{name: "garbage with colons", details: `targets: ["a:b:c"]`, wantErr: "targets[0]: \"a:b:c\" is neither"},
		{name: "port out of range", details: `targets: ["a:70000"]`, wantErr: "targets[0]"},
		{name: "range over maxTargets", details: `targets: [10.0.0.0/16]`, wantErr: "targets[0]: 10.0.0.0/16 on 1 port(s) brings the targets to 65534, more than maxTargets (1024)"},
		{name: "huge range", details: `targets: [10.0.0.0/8]`, wantErr: "targets[0]: 10.0.0.0/8 on 1 port(s) brings the targets to 16777214"},
		{name: "huge IPv6 range", details: `targets: ["fd00::/64"]`, wantErr: "targets[0]: fd00::/64 has 2^64 addresses"},
		{name: "ranges add up", details: `{"targets": ["10.0.0.0/24", "10.0.1.0/24"], "ports": [502, 503], "maxTargets": 600}`, wantErr: "targets[1]"},
		{name: "maxTargets too big", details: `{"targets": ["a"], "maxTargets": 100000}`, wantErr: "maxTargets"},
		{name: "bad port", details: `{"targets": ["a"], "ports": [502, 0]}`, wantErr: "ports[1]"},
		{name: "bad unit id", details: `{"targets": ["a"], "unitIds": [1, 256]}`, wantErr: "unitIds[1]"},
		{name: "duplicate unit id", details: `{"targets": ["a"], "unitIds": [1, 1]}`, wantErr: "unitIds[1]: 1 duplicates unitIds[0]"},
		{name: "bad function", details: `{"targets": ["a"], "probe": {"function": "coils"}}`, wantErr: "probe.function"},
		{name: "bad count", details: `{"targets": ["a"], "probe": {"count": 126}}`, wantErr: "probe.count"},
		{name: "bad address", details: `{"targets": ["a"], "probe": {"address": 65535, "count": 2}}`, wantErr: "probe.address"},
		{name: "address with identification", details: `{"targets": ["a"], "probe": {"function": "deviceIdentification", "address": 3}}`, wantErr: "probe.address"},
		{name: "bad serial object", details: `{"targets": ["a"], "probe": {"identify": true, "serialObjectId": 6}}`, wantErr: "probe.serialObjectId"},
		{name: "serial without identify", details: `{"targets": ["a"], "probe": {"serialObjectId": 128}}`, wantErr: "probe.serialObjectId: needs"},
		{name: "match offset", details: `{"targets": ["a"], "probe": {"count": 2}, "match": {"registers": [{"offset": 2, "equals": 1}]}}`, wantErr: "match.registers[0].offset"},
		{name: "match without condition", details: `{"targets": ["a"], "match": {"registers": [{"offset": 0}]}}`, wantErr: "match.registers[0]: needs"},
		{name: "match value", details: `{"targets": ["a"], "match": {"registers": [{"offset": 0, "equals": 70000}]}}`, wantErr: "match.registers[0].equals"},
		{name: "match registers with identification probe", details: `{"targets": ["a"], "probe": {"function": "deviceIdentification"}, "match": {"registers": [{"offset": 0, "equals": 1}]}}`, wantErr: "match.registers"},
		{name: "match identification without identify", details: `{"targets": ["a"], "match": {"identification": {"vendorName": "x"}}}`, wantErr: "match.identification"},
		{name: "match unknown identification field", details: `{"targets": ["a"], "probe": {"identify": true}, "match": {"identification": {"colour": "x"}}}`, wantErr: "match.identification.colour"},
		{name: "match bad regexp", details: `{"targets": ["a"], "probe": {"identify": true}, "match": {"identification": {"vendorName": "("}}}`, wantErr: "match.identification.vendorName"},
		{name: "bad timeout", details: `{"targets": ["a"], "timeout": "1"}`, wantErr: "timeout"},
		{name: "rescan too short", details: `{"targets": ["a"], "rescanInterval": "10ms"}`, wantErr: "rescanInterval"},
		{name: "bad concurrency", details: `{"targets": ["a"], "concurrency": 1000}`, wantErr: "concurrency"},
		{name: "bad rate", details: `{"targets": ["a"], "probesPerSecond": -1}`, wantErr: "probesPerSecond"},
		{name: "bad threshold", details: `{"targets": ["a"], "failureThreshold": -1}`, wantErr: "failureThreshold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ParseDetails(tc.details)
			if tc.wantErr != "" {
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.wantErr) {
					t.Fatalf("ParseDetails(%q) = %v, want InvalidArgument containing %q", tc.details, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseDetails(%q) = %v", tc.details, err)
			}
			tc.check(t, d)
		})
	}
}
