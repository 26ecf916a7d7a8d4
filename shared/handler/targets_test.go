package handler

import (
	"fmt"
	"strings"
	"testing"
)

// TestExpandTargets: ranges without their IPv4 network and broadcast
// addresses, hosts on every port, repeats once, bare IPv6, and refusals
// that name the target, a /8 among them, before anything is listed.
func TestExpandTargets(t *testing.T) {
	got, err := ExpandTargets([]string{"10.0.0.0/30", "10.0.0.1", "plc:1502", "fd00::5", " 10.0.0.2:502 "}, []int{502, 503}, 20, "TCP")
	if err != nil {
		t.Fatal(err)
	}
	want := "[10.0.0.1:502 10.0.0.1:503 10.0.0.2:502 10.0.0.2:503 plc:1502 [fd00::5]:502 [fd00::5]:503]"
	if s := fmt.Sprint(got); s != want {
		t.Errorf("got %s\nwant %s", s, want)
	}
	for targets, why := range map[string]string{
		"10.0.0.0/8":   "brings the targets to 16777214",
		"10.0.0.0/7":   "targets[0]: 10.0.0.0/7 has 2^25 addresses",
		"10.0.0.0/24":  "brings the targets to 254, more than maxTargets (20)",
		"":             "targets[0]: must not be empty",
		"host:99999":   `"99999" is not a TCP port`,
		"fd00::5:x:1":  "is neither host:port nor an IPv6 address",
		"10.0.0.0/33":  "is not a CIDR range",
		"bad host:502": "has no valid host",
	} {
		if _, err := ExpandTargets([]string{targets}, []int{502}, 20, "TCP"); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%q: %v, want %q", targets, err, why)
		}
	}
}
