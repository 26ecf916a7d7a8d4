// Package netns makes the network namespaces and veth links test peers run
// in, so that their traffic stays on links the test made; each is removed,
// by name, when the test ends.
package netns

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// Require fails the test under CI=true, and skips it otherwise, unless it
// runs as root with iproute2's ip on PATH; what says what needs them.
func Require(t testing.TB, what string) {
	t.Helper()
	if os.Geteuid() != 0 {
		npmpeer.Unavailable(t, "%s needs root (network namespaces and veth links)", what)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		npmpeer.Unavailable(t, "%s needs ip (Debian package iproute2)", what)
	}
}

// IP runs ip with args and fails the test if it fails.
func IP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// Add makes the network namespace name, deleted when the test ends.
func Add(t testing.TB, name string) {
	t.Helper()
	IP(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
}

// AddVeth makes a veth pair: local in this namespace, deleted when the test
// ends (its peer goes with it), and peer in namespace ns.
func AddVeth(t testing.TB, local, peer, ns string) {
	t.Helper()
	IP(t, "link", "add", local, "type", "veth", "peer", "name", peer, "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", local).Run() })
}

// WaitUp waits until the interface ifname of this namespace is up: a new
// link takes a moment to leave its tentative state.
func WaitUp(t testing.TB, ifname string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile("/sys/class/net/" + ifname + "/operstate")
		if err == nil && strings.TrimSpace(string(b)) == "up" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not up", ifname)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
