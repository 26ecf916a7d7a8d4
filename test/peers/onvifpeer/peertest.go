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
	"syscall"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/peers/netns"
)

func need(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("needs " + what + " (CI=true: a missing prerequisite fails)")
	}
	t.Skip("needs " + what)
}

// PeerNet makes a network namespace joined to this one by a veth pair, so
// that multicast stays on links the test made. It returns the namespace,
// the local interface, and the peer's interface and address.
func PeerNet(t testing.TB) (ns string, local net.Interface, peerIf string, peer netip.Addr) {
	t.Helper()
	netns.Require(t, "a WS-Discovery peer")
	n := os.Getpid() % 10000
	ns = fmt.Sprintf("dwwsd%d", n)
	a, b := fmt.Sprintf("dwwa%d", n), fmt.Sprintf("dwwb%d", n)
	sub := n % 250
	netns.Add(t, ns)
	netns.AddVeth(t, a, b, ns)
	netns.IP(t, "addr", "add", fmt.Sprintf("10.213.%d.1/24", sub), "dev", a)
	netns.IP(t, "link", "set", a, "up")
	netns.IP(t, "-n", ns, "addr", "add", fmt.Sprintf("10.213.%d.2/24", sub), "dev", b)
	netns.IP(t, "-n", ns, "link", "set", b, "up")
	netns.IP(t, "-n", ns, "link", "set", "lo", "up")
	netns.WaitUp(t, a)
	ifc, err := net.InterfaceByName(a)
	if err != nil {
		t.Fatal(err)
	}
	return ns, *ifc, b, netip.MustParseAddr(fmt.Sprintf("10.213.%d.2", sub))
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
