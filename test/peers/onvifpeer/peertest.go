//go:build linux

// Package peertest runs WS-Discovery peers for tests inside network
// namespaces the test creates, so that multicast never leaves links the test
// made. Everything it creates is removed, by name or pid, when the test ends.
package onvifpeer

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func need(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("needs " + what + " (CI=true: a missing prerequisite fails)")
	}
	t.Skip("needs " + what)
}

func ip(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// PeerNet makes a network namespace joined to this one by a veth pair, so
// that multicast stays on links the test made. It returns the namespace,
// the local interface, and the peer's interface and address.
func PeerNet(t testing.TB) (ns string, local net.Interface, peerIf string, peer netip.Addr) {
	t.Helper()
	if os.Geteuid() != 0 {
		need(t, "root (it creates a network namespace and a veth pair)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		need(t, "ip on PATH")
	}
	n := os.Getpid() % 10000
	ns = fmt.Sprintf("dwwsd%d", n)
	a, b := fmt.Sprintf("dwwa%d", n), fmt.Sprintf("dwwb%d", n)
	sub := n % 250
	ip(t, "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	ip(t, "link", "add", a, "type", "veth", "peer", "name", b)
	t.Cleanup(func() { exec.Command("ip", "link", "del", a).Run() })
	ip(t, "link", "set", b, "netns", ns)
	ip(t, "addr", "add", fmt.Sprintf("10.213.%d.1/24", sub), "dev", a)
	ip(t, "link", "set", a, "up")
	ip(t, "-n", ns, "addr", "add", fmt.Sprintf("10.213.%d.2/24", sub), "dev", b)
	ip(t, "-n", ns, "link", "set", b, "up")
	ip(t, "-n", ns, "link", "set", "lo", "up")
	ifc, err := net.InterfaceByName(a)
	if err != nil {
		t.Fatal(err)
	}
	// The link needs a moment to leave the "tentative" state.
	deadline := time.Now().Add(5 * time.Second)
	for ifc.Flags&net.FlagUp == 0 || !running(a) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not up", a)
		}
		time.Sleep(20 * time.Millisecond)
		ifc, _ = net.InterfaceByName(a)
	}
	return ns, *ifc, b, netip.MustParseAddr(fmt.Sprintf("10.213.%d.2", sub))
}

func running(ifname string) bool {
	b, err := os.ReadFile("/sys/class/net/" + ifname + "/operstate")
	return err == nil && strings.TrimSpace(string(b)) == "up"
}

// Wsdd is a running wsdd.
type Wsdd struct {
	cmd    *exec.Cmd
	done   chan struct{}
	stderr bytes.Buffer
}

// StartWsdd runs Debian's wsdd in ns with Debian's Python, stopped by pid
// when the test ends.
func StartWsdd(t testing.TB, ns, ifname, uuid string) *Wsdd {
	t.Helper()
	if _, err := os.Stat("/usr/sbin/wsdd"); err != nil {
		need(t, "/usr/sbin/wsdd (Debian package wsdd)")
	}
	w := &Wsdd{done: make(chan struct{})}
	w.cmd = exec.Command("ip", "netns", "exec", ns, "/usr/bin/python3", "/usr/sbin/wsdd", "-4", "-i", ifname, "-U", uuid, "-n", "dowse-test", "-v")
	w.cmd.Stderr = &w.stderr
	w.cmd.Stdout = &w.stderr
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.cmd.Wait(); close(w.done) }()
	t.Cleanup(func() {
		w.Stop()
		if t.Failed() {
			t.Logf("wsdd output:\n%s", w.stderr.String())
		}
	})
	return w
}

// Stop ends wsdd with SIGTERM (it then sends Bye).
func (w *Wsdd) Stop() {
	select {
	case <-w.done:
		return
	default:
	}
	w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		w.cmd.Process.Kill()
		<-w.done
	}
}
