//go:build linux

package udev

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
)

// These tests read the real machine. Those that change it need root and
// tools; they fail when CI=true and skip otherwise when something is
// missing.

const udevdPath = "/lib/systemd/systemd-udevd"

func need(t *testing.T, what string) {
	t.Helper()
	msg := "needs " + what
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: a missing prerequisite fails)")
	}
	t.Skip(msg)
}

func needRoot(t *testing.T, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		need(t, "root (it creates devices and starts systemd-udevd)")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			need(t, tool+" on PATH")
		}
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// startUdevd runs systemd-udevd for the test, stopped by its pid when the
// test ends. When a udev daemon already runs (its control socket answers)
// the test uses that one.
func startUdevd(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(udevdPath); err != nil {
		need(t, udevdPath+" (Debian package udev)")
	}
	if c, err := netDialUnix(DefaultControlSocket); err == nil {
		c.Close()
		t.Log("a udev daemon already runs; using it")
		return
	}
	// A control socket file left by a daemon that is gone would make the
	// handler follow a silent monitor.
	os.Remove(DefaultControlSocket)
	runDir := filepath.Dir(DefaultControlSocket)
	_, err := os.Stat(runDir)
	madeRunDir := errors.Is(err, os.ErrNotExist)
	var stderr bytes.Buffer
	cmd := exec.Command(udevdPath)
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", udevdPath, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		os.Remove(DefaultControlSocket)
		if madeRunDir {
			// The daemon's database, made by the daemon the test ran.
			os.RemoveAll(runDir)
		}
		if t.Failed() {
			t.Logf("systemd-udevd stderr:\n%s", stderr.String())
		}
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c, err := netDialUnix(DefaultControlSocket); err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			t.Fatalf("systemd-udevd exited: %s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("systemd-udevd did not create %s within 5s: %s", DefaultControlSocket, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFor reads the stream until a list with exactly ids arrives, and
// returns it and when it arrived.
func waitFor(t *testing.T, s *handlertest.Stream, ids []string, timeout time.Duration) ([]*discoveryv1.Device, time.Time) {
	t.Helper()
	slices.Sort(ids)
	deadline := time.Now().Add(timeout)
	var last []string
	for {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("no list %q within %v; last %q", ids, timeout, last)
		}
		devs := s.Next(t, left)
		at := time.Now()
		last = handlertest.IDs(devs)
		if slices.Equal(last, ids) {
			return devs, at
		}
	}
}

func discover(t *testing.T, reg *discoveryv1.RegisterDiscoveryHandlerRequest, rules ...string) *handlertest.Stream {
	t.Helper()
	var b strings.Builder
	b.WriteString("udevRules:\n")
	for _, r := range rules {
		fmt.Fprintf(&b, "- '%s'\n", r)
	}
	return handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: b.String()})
}

// TestMachineNull finds /dev/null, as Akri's own test does, and checks that
// the fs.FS reader agrees with libudev on it.
func TestMachineNull(t *testing.T) {
	if _, err := os.Stat("/sys/devices/virtual/mem/null/uevent"); err != nil {
		need(t, "/sys mounted")
	}
	for name, src := range testSources("") {
		t.Run(name, func(t *testing.T) {
			reg := runHandler(t, src)
			s := discover(t, reg, `KERNEL=="null"`)
			devs, _ := waitFor(t, s, []string{null}, 5*time.Second)
			d := devs[0]
			if d.Properties[DevnodeProperty] != "/dev/null" || d.Properties[DevpathProperty] != null || d.Properties[SubsystemProperty] != "mem" {
				t.Errorf("properties %v", d.Properties)
			}
			if len(d.DeviceSpecs) != 1 || d.DeviceSpecs[0].HostPath != "/dev/null" || d.DeviceSpecs[0].Permissions != "rwm" {
				t.Errorf("device specs %v", d.DeviceSpecs)
			}
		})
	}

	fsd := NewSysfsDevice(os.DirFS("/"), null)
	if fsd == nil || fsd.Devnode() != "/dev/null" || fsd.Subsystem() != "mem" || fsd.Sysname() != "null" {
		t.Errorf("fs.FS reader on /: %+v", fsd)
	}
}

// TestMachineLoop attaches a loop device to an image with a labelled ext4
// file system: udevd's blkid gives it ID_FS_LABEL, the device appears in
// the stream, and leaves it when the loop device is detached.
func TestMachineLoop(t *testing.T) {
	needRoot(t, "losetup", "mkfs.ext4")
	startUdevd(t)
	label := fmt.Sprintf("dowse-%d", os.Getpid()%100000)
	img := filepath.Join(t.TempDir(), "fs.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 8<<20); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.ext4", "-q", "-L", label, img)

	for name, src := range testSources("") {
		t.Run(name, func(t *testing.T) { loopDevice(t, src, img, label) })
	}
}

func loopDevice(t *testing.T, src Source, img, label string) {
	reg := runHandler(t, src)
	s := discover(t, reg, `SUBSYSTEM=="block", KERNEL=="loop*", ENV{ID_FS_LABEL}=="`+label+`"`)
	waitFor(t, s, nil, 5*time.Second)

	start := time.Now()
	loopDev := run(t, "losetup", "--find", "--show", img)
	detached := false
	t.Cleanup(func() {
		if !detached {
			exec.Command("losetup", "-d", loopDev).Run()
		}
	})
	devpath := "/devices/virtual/block/" + filepath.Base(loopDev)
	devs, at := waitFor(t, s, []string{devpath}, 10*time.Second)
	t.Logf("loop device %s in the stream %v after losetup started", loopDev, at.Sub(start))
	p := devs[0].Properties
	if p[DevnodeProperty] != loopDev || p["ID_FS_LABEL"] != label || p["ID_FS_TYPE"] != "ext4" {
		t.Errorf("properties %v", p)
	}
	if len(devs[0].DeviceSpecs) != 1 || devs[0].DeviceSpecs[0].HostPath != loopDev {
		t.Errorf("device specs %v", devs[0].DeviceSpecs)
	}

	start = time.Now()
	run(t, "losetup", "-d", loopDev)
	detached = true
	_, at = waitFor(t, s, nil, 10*time.Second)
	t.Logf("loop device %s left the stream %v after losetup -d started", loopDev, at.Sub(start))
}

// netLinks adds and removes a veth pair and a tap device and checks that
// each change reaches the stream; it returns the latencies seen.
func netLinks(t *testing.T, src Source) []time.Duration {
	t.Helper()
	n := os.Getpid() % 10000
	va, vb, tap := fmt.Sprintf("dwva%d", n), fmt.Sprintf("dwvb%d", n), fmt.Sprintf("dwt%d", n)
	created := map[string]bool{}
	t.Cleanup(func() {
		for name := range created {
			exec.Command("ip", "link", "del", name).Run()
		}
	})
	sysNet := func(name string) string { return "/devices/virtual/net/" + name }

	reg := runHandler(t, src)
	s := discover(t, reg, fmt.Sprintf(`SUBSYSTEM=="net", KERNEL=="dwv[ab]%d|dwt%d"`, n, n))
	waitFor(t, s, nil, 5*time.Second)

	var lat []time.Duration
	step := func(want []string, cmd ...string) {
		t.Helper()
		start := time.Now()
		run(t, cmd[0], cmd[1:]...)
		_, at := waitFor(t, s, want, 10*time.Second)
		lat = append(lat, at.Sub(start))
		t.Logf("%s: in the stream after %v", strings.Join(cmd, " "), at.Sub(start))
	}
	created[va] = true
	step([]string{sysNet(va), sysNet(vb)}, "ip", "link", "add", va, "type", "veth", "peer", "name", vb)
	created[tap] = true
	step([]string{sysNet(va), sysNet(vb), sysNet(tap)}, "ip", "tuntap", "add", "dev", tap, "mode", "tap")
	step([]string{sysNet(tap)}, "ip", "link", "del", va)
	delete(created, va)
	step(nil, "ip", "tuntap", "del", "dev", tap, "mode", "tap")
	delete(created, tap)
	return lat
}

// TestMachineNetLinks follows veth and tap devices through the udev daemon.
func TestMachineNetLinks(t *testing.T) {
	needRoot(t, "ip")
	startUdevd(t)
	for name, src := range testSources("") {
		t.Run(name, func(t *testing.T) {
			if m := src.(interface{ Mode() string }).Mode(); m != ModeUdev {
				t.Fatalf("mode %q with udevd running", m)
			}
			netLinks(t, src)
		})
	}
}

// TestMachineKernelFallback follows the same devices through kernel
// uevents, as the handler does when no udev daemon runs.
func TestMachineKernelFallback(t *testing.T) {
	needRoot(t, "ip")
	for name, src := range testSources(filepath.Join(t.TempDir(), "no-control")) {
		t.Run(name, func(t *testing.T) {
			if m := src.(interface{ Mode() string }).Mode(); m != ModeKernel {
				t.Fatalf("mode %q without a control socket", m)
			}
			netLinks(t, src)
		})
	}
}

// testSources returns every Source this build has, by name, following
// controlSocket's daemon.
func testSources(controlSocket string) map[string]Source {
	srcs := map[string]Source{"netlink": NewNetlinkSource(nil, controlSocket)}
	for name, s := range cgoSources(controlSocket) {
		srcs[name] = s
	}
	return srcs
}

func netDialUnix(path string) (interface{ Close() error }, error) {
	return net.Dial("unixpacket", path) // udevd's control socket is SOCK_SEQPACKET
}
