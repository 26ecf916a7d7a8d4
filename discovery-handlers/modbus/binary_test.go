package modbus_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// TestBinaryPeakRSS runs the real dowse-modbus-discovery binary through a
// /24 scan and reports its peak resident memory (goal: under 16 MiB). It
// fails only above maxPeakRSS, a regression bound.
func TestBinaryPeakRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	port := commonPort(t, "127.0.0.10", "127.0.0.20")
	npmpeer.StartModbus(t, "jsmodbus", map[string]any{"impl": "jsmodbus", "host": "127.0.0.10", "port": port})
	npmpeer.StartModbus(t, "modbus-serial", map[string]any{"impl": "modbus-serial", "host": "127.0.0.20", "port": port})

	bin := filepath.Join(t.TempDir(), "dowse-modbus-discovery")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/dowse-modbus-discovery").CombinedOutput(); err != nil {
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
	reg := agent.WaitForRegistration(t, wait)
	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{
		DiscoveryDetails: fmt.Sprintf(`{"targets": ["127.0.0.0/24"], "ports": [%d], "rescanInterval": "100ms"}`, port),
	})
	if devs := s.Next(t, 30*time.Second); len(devs) != 2 {
		t.Fatalf("got %d devices, want 2", len(devs))
	}
	// Two more rounds (unchanged lists, so the SDK sends nothing), so that
	// the peak covers steady scanning too.
	time.Sleep(2 * (2540*time.Millisecond + 100*time.Millisecond))
	hwm, err := procs.PeakRSSOf(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE: dowse-modbus-discovery peak RSS over 3 scans of a /24: %.1f MiB", float64(hwm)/1024)
	// The goal is 16 MiB; about 12 MiB of any handler is the binary's own
	// mapped code (gRPC and protobuf mostly), so this guards against a
	// regression rather than the goal.
	if hwm > maxPeakRSS {
		t.Errorf("peak RSS %d KiB, more than the %d KiB regression bound", hwm, maxPeakRSS)
	}
}

// maxPeakRSS is the regression bound of TestBinaryPeakRSS, in KiB.
const maxPeakRSS = 20 * 1024
