// Package avahi runs Debian's avahi-daemon, an mDNS/DNS-SD responder, for
// tests, in network namespaces the test makes: a link (a veth pair) between
// a namespace for the daemon and one for the program under test, so that
// multicast never leaves them. The daemon runs without D-Bus
// (enable-dbus=no) and publishes static service files from a folder of the
// test's own, bind-mounted over /etc/avahi/services in a private mount
// namespace (where /run is a tmpfs, for its pid file); Publish and
// Withdraw change that folder and make the daemon reload it (SIGHUP), which
// announces new services and sends goodbyes for withdrawn ones.
package avahi

import (
	"fmt"
	"html"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/netns"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// Link is two network namespaces joined by a veth pair.
type Link struct {
	// PeerNS and TestNS are the namespaces' names; PeerIf and TestIf the
	// interfaces in them; PeerAddr and TestAddr their addresses: IPv4 on
	// a link of NewLink, IPv6 (unique local, beside the link-local ones)
	// on a link of NewIPv6Link.
	PeerNS, TestNS     string
	PeerIf, TestIf     string
	PeerAddr, TestAddr string
	// IPv6 says the link has IPv6 addresses only: the daemon then speaks
	// mDNS over IPv6 only.
	IPv6 bool
}

// NewLink makes the namespaces and the link with IPv4 addresses, and
// removes them when the test ends. It needs root and iproute2; without them
// it fails under CI=true and skips otherwise.
func NewLink(t testing.TB) *Link {
	t.Helper()
	return newLink(t, false)
}

// NewIPv6Link is NewLink with IPv6 addresses only (no IPv4 at all). It
// waits until the link-local addresses have passed duplicate address
// detection, so that the daemon can use them at once.
func NewIPv6Link(t testing.TB) *Link {
	t.Helper()
	return newLink(t, true)
}

func newLink(t testing.TB, v6 bool) *Link {
	t.Helper()
	netns.Require(t, "avahi-daemon's link")
	id := rand.IntN(1 << 20)
	n := rand.IntN(250) + 1
	l := &Link{
		PeerNS: fmt.Sprintf("dowse-mdns-%x-p", id), TestNS: fmt.Sprintf("dowse-mdns-%x-t", id),
		PeerIf: "veth-peer", TestIf: "veth-test",
		PeerAddr: fmt.Sprintf("10.251.%d.1", n), TestAddr: fmt.Sprintf("10.251.%d.2", n),
		IPv6: v6,
	}
	prefix := "/24"
	if v6 {
		l.PeerAddr, l.TestAddr, prefix = fmt.Sprintf("fd00:dd:%x::1", n), fmt.Sprintf("fd00:dd:%x::2", n), "/64"
	}
	netns.Add(t, l.PeerNS)
	netns.Add(t, l.TestNS)
	netns.IP(t, "-n", l.PeerNS, "link", "add", l.PeerIf, "type", "veth", "peer", "name", l.TestIf, "netns", l.TestNS)
	for _, side := range [][3]string{{l.PeerNS, l.PeerIf, l.PeerAddr}, {l.TestNS, l.TestIf, l.TestAddr}} {
		if v6 {
			netns.IP(t, "netns", "exec", side[0], "sysctl", "-q", "-w", "net.ipv6.conf."+side[1]+".accept_dad=0")
			netns.IP(t, "-n", side[0], "addr", "add", side[2]+prefix, "dev", side[1], "nodad")
		} else {
			netns.IP(t, "-n", side[0], "addr", "add", side[2]+prefix, "dev", side[1])
		}
		netns.IP(t, "-n", side[0], "link", "set", side[1], "multicast", "on", "up")
		netns.IP(t, "-n", side[0], "link", "set", "lo", "up")
	}
	if v6 {
		deadline := time.Now().Add(10 * time.Second)
		for _, side := range [][2]string{{l.PeerNS, l.PeerIf}, {l.TestNS, l.TestIf}} {
			for {
				out, err := exec.Command("ip", "-n", side[0], "-6", "addr", "show", "dev", side[1], "scope", "link").CombinedOutput()
				if err == nil && strings.Contains(string(out), "fe80:") && !strings.Contains(string(out), "tentative") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s in %s has no usable link-local address: %s", side[1], side[0], out)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	return l
}

// Service is one DNS-SD service the daemon publishes.
type Service struct {
	// Name is the instance name, e.g. "Office printer".
	Name string
	// Type is the service type, e.g. _ipp._tcp.
	Type string
	Port int
	// TXT are the TXT record's strings, e.g. "ty=Acme Laser".
	TXT []string
}

// Daemon is a running avahi-daemon.
type Daemon struct {
	Out      *procs.Lines
	proc     *procs.Proc
	services string
	t        testing.TB
}

// Binary returns avahi-daemon's path, failing under CI=true and skipping
// otherwise when it is not installed.
func Binary(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"/usr/sbin/avahi-daemon", "/usr/bin/avahi-daemon"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	npmpeer.Unavailable(t, "avahi-daemon not found: run hack/install-deps.sh (Debian avahi-daemon)")
	return ""
}

// Start runs avahi-daemon in l's peer namespace, publishing services, and
// stops it (by its pid) when the test ends. hostName is the host name it
// announces (its address records are the peer's addresses).
func Start(t testing.TB, l *Link, hostName string, services ...Service) *Daemon {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	d := &Daemon{Out: procs.NewLines(), services: filepath.Join(dir, "services"), t: t}
	if err := os.Mkdir(d.services, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range services {
		d.write(s)
	}
	conf := fmt.Sprintf(`[server]
host-name=%s
domain-name=local
use-ipv4=%s
use-ipv6=%s
allow-interfaces=%s
enable-dbus=no
ratelimit-interval-usec=0
[wide-area]
enable-wide-area=no
[publish]
publish-hinfo=no
publish-workstation=no
publish-addresses=yes
[reflector]
enable-reflector=no
[rlimits]
`, hostName, yesNo(!l.IPv6), yesNo(l.IPv6), l.PeerIf)
	confPath := filepath.Join(dir, "avahi-daemon.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// A private mount namespace: /run a tmpfs (the daemon's pid file and
	// socket folder), the services folder over /etc/avahi/services.
	script := fmt.Sprintf(`set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/avahi-daemon
mount --bind %q /etc/avahi/services
exec %q -f %q --no-drop-root --no-chroot --no-rlimits --no-proc-title --debug`, d.services, bin, confPath)
	p, err := procs.Run("avahi-daemon", "ip", []string{"netns", "exec", l.PeerNS, "unshare", "-m", "--propagation", "private", "sh", "-c", script},
		procs.Options{Stdout: d.Out, Stderr: d.Out, DieWithCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	d.proc = p
	d.Out.EndWith(p)
	t.Cleanup(d.Stop)
	if _, _, err := d.Out.Wait("Server startup complete", 0, 20*time.Second); err != nil {
		d.Stop()
		t.Fatalf("avahi-daemon did not start: %v\n%s", err, d.Out)
	}
	return d
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func fileName(s Service) string {
	return strings.NewReplacer("/", "_", " ", "_").Replace(s.Name+s.Type) + ".service"
}

func (d *Daemon) write(s Service) {
	d.t.Helper()
	var txt strings.Builder
	for _, r := range s.TXT {
		fmt.Fprintf(&txt, "    <txt-record>%s</txt-record>\n", html.EscapeString(r))
	}
	x := fmt.Sprintf(`<?xml version="1.0" standalone='no'?>
<!DOCTYPE service-group SYSTEM "avahi-service.dtd">
<service-group>
  <name>%s</name>
  <service>
    <type>%s</type>
    <port>%d</port>
%s  </service>
</service-group>
`, html.EscapeString(s.Name), html.EscapeString(s.Type), s.Port, txt.String())
	if err := os.WriteFile(filepath.Join(d.services, fileName(s)), []byte(x), 0o644); err != nil {
		d.t.Fatal(err)
	}
}

// reload makes the daemon read its service files again.
func (d *Daemon) reload() {
	d.t.Helper()
	if err := syscall.Kill(d.proc.Pid(), syscall.SIGHUP); err != nil {
		d.t.Fatal(err)
	}
}

// Publish adds a service; the daemon announces it.
func (d *Daemon) Publish(s Service) {
	d.t.Helper()
	d.write(s)
	d.reload()
}

// Withdraw removes a service; the daemon sends its goodbye (TTL 0).
func (d *Daemon) Withdraw(s Service) {
	d.t.Helper()
	if err := os.Remove(filepath.Join(d.services, fileName(s))); err != nil {
		d.t.Fatal(err)
	}
	d.reload()
}

// Stop stops the daemon (by its pid), which withdraws everything, and waits
// for it.
func (d *Daemon) Stop() {
	if d.proc != nil {
		d.proc.StopWithin(5 * time.Second)
	}
	d.proc = nil
}
