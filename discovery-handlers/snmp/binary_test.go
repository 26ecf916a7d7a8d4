package snmp_test

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
	"github.com/dowse-dev/dowse/test/peers/snmpd"
)

// TestBinaryPeakRSS runs the real dowse-snmp-discovery binary through
// sweeps of a /24 and reports its peak resident memory (goal: under 16
// MiB). It fails only above maxPeakRSS, a regression bound.
func TestBinaryPeakRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	port := snmpd.FreePort(t, "127.0.0.31", "127.0.0.32")
	snmpd.Start(t, snmpd.Config{Host: "127.0.0.31", Port: port, SysDescr: "one", SysObjectID: ".1.3.6.1.4.1.8072.3.2.10"})
	snmpd.Start(t, snmpd.Config{Host: "127.0.0.32", Port: port, SysDescr: "two", SysObjectID: ".1.3.6.1.4.1.8072.3.2.10"})

	bin := filepath.Join(t.TempDir(), "dowse-snmp-discovery")
	// Built as its image is (make images): static, stripped, without
	// gRPC's tracing.
	build := exec.Command("go", "build", "-tags", "grpcnotrace", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/dowse-snmp-discovery")
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
	reg := agent.WaitForRegistration(t, wait)
	// 1,000 packets a second and 64 in flight: the handler's busiest.
	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{
		DiscoveryDetails: fmt.Sprintf(`{"targets": ["127.0.0.0/24"], "ports": [%d], "rescanInterval": "100ms", "packetsPerSecond": 1000, "concurrency": 64}`, port),
	})
	if devs := s.Next(t, 30*time.Second); len(devs) != 2 {
		t.Fatalf("got %d devices, want 2", len(devs))
	}
	// Two more rounds, so that the peak covers steady scanning too.
	time.Sleep(2 * time.Second)
	hwm, err := procs.PeakRSSOf(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE: dowse-snmp-discovery peak RSS over sweeps of a /24: %.1f MiB", float64(hwm)/1024)
	// About 12 MiB of any handler is the binary's own mapped code (gRPC
	// and protobuf mostly), so this guards against a regression rather
	// than the goal.
	if hwm > maxPeakRSS {
		t.Errorf("peak RSS %d KiB, more than the %d KiB regression bound", hwm, maxPeakRSS)
	}
}

// maxPeakRSS is the regression bound of TestBinaryPeakRSS, in KiB.
const maxPeakRSS = 20 * 1024
