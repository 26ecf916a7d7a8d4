package cluster

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The pod network's addresses all come from the benchmarking block
// 198.18.0.0/15 (RFC 2544), never a private or public range: pods in a /24
// of 198.18.0.0/16, Services in 198.19.0.0/24 (serviceCIDR), and the link
// between the machine and the node's network namespace in a /30 of
// 198.19.255.0/24.
const (
	podNetworkName = "dowse-pod-network"
	// cniPluginDir is where Debian's containernetworking-plugins puts the
	// bridge, host-local and loopback plugins.
	cniPluginDir = "/usr/lib/cni"
	// cniCacheDir is the CNI library's cache, which containerd does not let
	// us move.
	cniCacheDir = "/var/lib/cni"
)

// PodNetwork is the test node's own network, made by Start when
// Options.PodNetwork is set: a network namespace that containerd, the
// kubelet and kube-proxy run in (so their bridge, routes and nftables rules
// never touch the machine's), joined to the machine by a veth pair. Pods get
// addresses on a bridge in PodCIDR and reach Services through kube-proxy;
// the control plane stays on the machine, listening on HostIP, which is
// also where a test serves peers that pods must reach. Stop deletes all of
// it.
type PodNetwork struct {
	// Namespace is the network namespace's name (ip netns).
	Namespace string
	// HostIP is the machine's end of the veth pair, NodeIP the node's (its
	// InternalIP).
	HostIP, NodeIP string
	// PodCIDR holds every pod's address; the machine routes it to NodeIP,
	// so a test reaches pods at their own addresses.
	PodCIDR string
	// HostLink is the machine's end of the veth pair.
	HostLink string
}

// newPodNetwork makes the namespace, the veth pair, their addresses and
// routes. Its /30 and pod /24 are picked at random, so that what a killed
// run left behind does not stand in the way of the next.
func newPodNetwork() (_ *PodNetwork, err error) {
	for _, need := range []string{"ip", "nsenter", "nft", "iptables"} {
		if _, err := exec.LookPath(need); err != nil {
			return nil, fmt.Errorf("the pod network needs %s: run hack/install-node-deps.sh", need)
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniPluginDir, plugin)); err != nil {
			return nil, fmt.Errorf("the pod network needs the CNI plugin %s in %s: run hack/install-node-deps.sh (containernetworking-plugins)", plugin, cniPluginDir)
		}
	}
	var r [3]byte
	if _, err := rand.Read(r[:]); err != nil {
		return nil, err
	}
	id := fmt.Sprintf("%02x%02x%02x", r[0], r[1], r[2])
	quad := int(r[0]%63+1) * 4 // a /30 of 198.19.255.0/24, not the first
	n := &PodNetwork{
		Namespace: "dowse-node-" + id,
		HostLink:  "dowse" + id,
		HostIP:    fmt.Sprintf("198.19.255.%d", quad+1),
		NodeIP:    fmt.Sprintf("198.19.255.%d", quad+2),
		PodCIDR:   fmt.Sprintf("198.18.%d.0/24", r[1]),
	}
	if err := ipCmd("netns", "add", n.Namespace); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.delete())
		}
	}()
	steps := [][]string{
		{"link", "add", n.HostLink, "type", "veth", "peer", "name", "eth0", "netns", n.Namespace},
		{"addr", "add", n.HostIP + "/30", "dev", n.HostLink},
		{"link", "set", n.HostLink, "up"},
		{"route", "add", n.PodCIDR, "via", n.NodeIP, "dev", n.HostLink},
		{"-n", n.Namespace, "link", "set", "lo", "up"},
		{"-n", n.Namespace, "addr", "add", n.NodeIP + "/30", "dev", "eth0"},
		{"-n", n.Namespace, "link", "set", "eth0", "up"},
		// Processes on the node's own network (hostNetwork pods, the
		// kubelet) reach Services: their packets need a route before
		// kube-proxy's rules rewrite where they go. No default route: nothing
		// of the node's is meant to leave for the machine's networks.
		{"-n", n.Namespace, "route", "add", serviceCIDR, "via", n.HostIP},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return nil, err
		}
	}
	// The node routes between its pods and the machine.
	if out, err := exec.Command("nsenter", "--net="+n.nsPath(), "--", "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("turning on forwarding in %s: %w: %s", n.Namespace, err, out)
	}
	return n, nil
}

func (n *PodNetwork) nsPath() string { return filepath.Join("/run/netns", n.Namespace) }

// Command runs path with args inside the node's network namespace (and only
// its network namespace: the kubelet and containerd must share the
// machine's mounts). nsenter execs the program, so its pid is the
// program's.
func (n *PodNetwork) Command(path string, args []string) (string, []string) {
	return "nsenter", append([]string{"--net=" + n.nsPath(), "--", path}, args...)
}

// cniConfig is the bridge network containerd gives pods: host-local
// addresses in PodCIDR, the node's bridge as their gateway, traffic leaving
// the pod range masqueraded, hairpin for a pod reaching itself through a
// Service. Address leases and the plugins' cache go under stateDir.
func (n *PodNetwork) cniConfig(stateDir string) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [{
    "type": "bridge",
    "bridge": "cni0",
    "isGateway": true,
    "ipMasq": true,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "dataDir": %q,
      "ranges": [[{"subnet": %q}]],
      "routes": [{"dst": "0.0.0.0/0"}]
    }
  }, {"type": "loopback"}]
}
`, podNetworkName, filepath.Join(stateDir, "cni", "ipam"), n.PodCIDR)
}

// kubeProxyConfig runs kube-proxy in nftables mode inside the namespace. It
// masquerades all Service traffic: without br_netfilter (a module these
// machines may not load) the reply of a pod reached through a Service by a
// pod on the same bridge would otherwise skip the un-NAT. The conntrack
// settings are left as the machine has them (zero: not set).
func (n *PodNetwork) kubeProxyConfig(kubeconfig, nodeName string, healthzPort, metricsPort int) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
hostnameOverride: %q
mode: nftables
clusterCIDR: %q
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
nftables:
  masqueradeAll: true
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, nodeName, n.PodCIDR, healthzPort, metricsPort)
}

// delete removes the namespace and the machine's end of the veth pair
// (which takes the node's end and the routes with it), and what the CNI
// library caches outside the state directory for this network.
func (n *PodNetwork) delete() error {
	var errs []error
	if linkExists(n.HostLink) {
		if err := ipCmd("link", "del", n.HostLink); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := os.Stat(n.nsPath()); err == nil {
		if err := ipCmd("netns", "del", n.Namespace); err != nil {
			errs = append(errs, err)
		}
	}
	// containerd's CNI library keeps each sandbox's result in
	// /var/lib/cni/results (not configurable there) until the sandbox is
	// torn down, which a stopped containerd no longer does.
	cached, _ := filepath.Glob(filepath.Join(cniCacheDir, "results", podNetworkName+"-*"))
	for _, f := range cached {
		if err := os.Remove(f); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// leftovers names what of the network is still there.
func (n *PodNetwork) leftovers() []string {
	var out []string
	if _, err := os.Stat(n.nsPath()); err == nil {
		out = append(out, "network namespace "+n.Namespace)
	}
	if linkExists(n.HostLink) {
		out = append(out, "link "+n.HostLink)
	}
	return out
}

func linkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}

func ipCmd(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// ServiceAddress is the ith address of the Service range (0 < i < 255),
// for a Service whose clusterIP a test fixes: no cluster DNS runs on the
// test node. The first is the kubernetes Service's.
func (n *PodNetwork) ServiceAddress(i int) string {
	a := netip.MustParsePrefix(serviceCIDR).Addr().As4()
	a[3] += byte(i)
	return netip.AddrFrom4(a).String()
}
