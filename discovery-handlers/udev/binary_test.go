//go:build linux

package udev

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

// lockedBuffer collects a process's stderr while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestBinary runs the real dowse-udev-discovery binary, built with cgo
// (libudev) and without (static, the netlink source, as images are built):
// it says at start what it follows, finds /dev/null, follows a veth pair
// when run as root, and reports its peak resident memory.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	for _, cgo := range []string{"1", "0"} {
		t.Run("CGO_ENABLED="+cgo, func(t *testing.T) { testBinary(t, cgo) })
	}
}

func testBinary(t *testing.T, cgo string) {
	bin := filepath.Join(t.TempDir(), "dowse-udev-discovery")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/dowse-udev-discovery")
	build.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	cmd := exec.Command(bin, "--state-dir", dir)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("handler stderr:\n%s", stderr.String())
		}
	})
	reg := agent.WaitForRegistration(t, 10*time.Second)
	if reg.GetShared() {
		t.Error("registered as shared")
	}
	// The handler's stderr is copied through a pipe by exec's goroutine,
	// which may lag behind the registration the agent already saw.
	says := func() bool {
		return strings.Contains(stderr.String(), "no udev daemon runs: following kernel uevents") || strings.Contains(stderr.String(), "following the udev daemon's events")
	}
	for deadline := time.Now().Add(10 * time.Second); !says() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !says() {
		t.Errorf("no start line saying what the handler follows in:\n%s", stderr.String())
	}
	s := discover(t, reg, `KERNEL=="null"`)
	waitFor(t, s, []string{null}, 5*time.Second)

	if os.Geteuid() == 0 {
		n := os.Getpid() % 10000
		va, vb := fmt.Sprintf("dwxa%d", n), fmt.Sprintf("dwxb%d", n)
		t.Cleanup(func() { exec.Command("ip", "link", "del", va).Run() })
		s2 := discover(t, reg, fmt.Sprintf(`SUBSYSTEM=="net", KERNEL=="dwx[ab]%d"`, n))
		waitFor(t, s2, nil, 5*time.Second)
		start := time.Now()
		run(t, "ip", "link", "add", va, "type", "veth", "peer", "name", vb)
		_, at := waitFor(t, s2, []string{"/devices/virtual/net/" + va, "/devices/virtual/net/" + vb}, 10*time.Second)
		t.Logf("FIGURE: CGO_ENABLED=%s: veth pair in the binary's Discover stream %v after ip link add started", cgo, at.Sub(start))
		run(t, "ip", "link", "del", va)
		waitFor(t, s2, nil, 10*time.Second)
	}

	hwm, err := procs.PeakRSSOf(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE: CGO_ENABLED=%s: dowse-udev-discovery peak RSS: %.1f MiB", cgo, float64(hwm)/1024)
	if hwm > 24*1024 {
		t.Errorf("peak RSS %d KiB, more than the 24 MiB regression bound", hwm)
	}
}
