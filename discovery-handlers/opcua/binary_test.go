package opcua_test

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
)

// maxPeakRSS is the regression bound of the binary's peak RSS, in KiB. The
// goal is 16 MiB; about 12 MiB of any handler is the binary's own mapped
// code (gRPC, protobuf, gopcua), so this guards against a regression rather
// than the goal.
const maxPeakRSS = 20 * 1024

// buildBinary builds dowse-opcua-discovery in the background, so that the
// build overlaps the slow start of the node-opcua peers; the returned
// function waits for it.
func buildBinary(t *testing.T) func() string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dowse-opcua-discovery")
	done := make(chan struct{})
	var (
		out []byte
		err error
	)
	go func() {
		defer close(done)
		out, err = exec.Command("go", "build", "-o", bin, "./cmd/dowse-opcua-discovery").CombinedOutput()
	}()
	// The build writes into t.TempDir, which must outlive it.
	t.Cleanup(func() { <-done })
	return func() string {
		t.Helper()
		<-done
		if err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		return bin
	}
}

// binaryPeakRSS runs the real binary polling the given discovery URLs every
// 200ms until it reports wantURI, then 5s more, and reports its peak
// resident memory (goal: under 16 MiB).
func binaryPeakRSS(t *testing.T, bin, wantURI string, urls ...string) {
	t.Helper()
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
	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: details("200ms", 3, "", urls...)})
	deadline := time.Now().Add(wait)
	for !strings.Contains(strings.Join(handlertest.IDs(s.Next(t, time.Until(deadline))), " "), wantURI) {
	}
	// Steady polling (unchanged lists, so the SDK sends nothing), so that
	// the peak covers it too.
	time.Sleep(5 * time.Second)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kib, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("FIGURE: dowse-opcua-discovery peak RSS polling an LDS and two servers every 200ms for 5s: %.1f MiB", float64(kib)/1024)
			if kib > maxPeakRSS {
				t.Errorf("peak RSS %d KiB, more than the %d KiB regression bound", kib, maxPeakRSS)
			}
			return
		}
	}
	t.Fatal("no VmHWM")
}
