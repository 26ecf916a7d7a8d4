//go:build linux

package onvif

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	peertest "github.com/dowse-dev/dowse/test/peers/onvifpeer"
)

// TestBinary runs the real dowse-onvif-discovery binary (static, as images
// are built) against a fake camera and reports its peak resident memory.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	ns, local, peerIf, peerAddr := peertest.PeerNet(t)
	const uuid = "b1b1b1b1-0000-4000-8000-0000000000b1"
	peertest.StartCamera(t, ns, peerIf, &peertest.Camera{UUID: uuid, Addr: peerAddr.String(), MAC: "c0:56:e3:00:00:b1"})

	bin := filepath.Join(t.TempDir(), "dowse-onvif-discovery")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/dowse-onvif-discovery")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	cmd := exec.Command(bin, "--state-dir", dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	reg := agent.WaitForRegistration(t, 10*time.Second)
	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(`{"interfaces": [%q], "probeInterval": "1s"}`, local.Name)})
	waitIDs(t, s, 10*time.Second, uuid)
	time.Sleep(3 * time.Second) // a few probe rounds
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			t.Logf("FIGURE: dowse-onvif-discovery peak RSS: %.1f MiB", float64(kb)/1024)
			if kb > 24*1024 {
				t.Errorf("peak RSS %d KiB, more than the 24 MiB regression bound", kb)
			}
		}
	}
}
