package snmpd

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/dowse-dev/dowse/test/peers/netns"
)

// Network is a network namespace for agents, joined to the test's own
// namespace by a veth pair: a /24 whose first address is the test's side
// (HostAddr) and whose others, handed out by NewAddr, are agents' on the
// namespace's side. Probes and sweeps then cross a real link and reach
// nothing but what the test made; the agents serve SNMP's own port, 161.
type Network struct {
	NS       string
	Prefix   netip.Prefix
	HostAddr string
	peerIf   string
	next     int
}

// NewNetwork makes the namespace and the link, removed (by name) when the
// test ends. It needs root and iproute2; without them it fails under
// CI=true and skips otherwise.
func NewNetwork(t testing.TB) *Network {
	t.Helper()
	netns.Require(t, "snmpd's network namespace")
	id := rand.IntN(1 << 20)
	sub := rand.IntN(250) + 1
	n := &Network{
		NS:       fmt.Sprintf("dowse-snmp-%05x", id),
		Prefix:   netip.MustParsePrefix(fmt.Sprintf("10.252.%d.0/24", sub)),
		HostAddr: fmt.Sprintf("10.252.%d.1", sub),
		peerIf:   "eth0",
		next:     2,
	}
	hostIf := fmt.Sprintf("dwsnmp%05x", id)
	netns.Add(t, n.NS)
	netns.AddVeth(t, hostIf, n.peerIf, n.NS)
	netns.IP(t, "addr", "add", n.HostAddr+"/24", "dev", hostIf)
	netns.IP(t, "link", "set", hostIf, "up")
	netns.IP(t, "-n", n.NS, "link", "set", n.peerIf, "up")
	netns.IP(t, "-n", n.NS, "link", "set", "lo", "up")
	netns.WaitUp(t, hostIf)
	return n
}

// NewAddr gives the namespace's side one more address of the /24.
func (n *Network) NewAddr(t testing.TB) string {
	t.Helper()
	if n.next > 254 {
		t.Fatalf("%s has no address left", n.Prefix)
	}
	a := n.Prefix.Addr().As4()
	a[3] = byte(n.next)
	n.next++
	addr := netip.AddrFrom4(a).String()
	netns.IP(t, "-n", n.NS, "addr", "add", addr+"/24", "dev", n.peerIf)
	return addr
}
