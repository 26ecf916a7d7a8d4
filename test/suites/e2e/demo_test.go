// Package e2e runs Dowse's real binaries as separate processes.
package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/kube"
)

// TestDemo runs `make demo`'s program with the real controller, agent,
// debug-echo and Modbus handlers and Modbus mapper binaries: the agent
// joins the cloud/edge link with a bootstrap token, a desired setpoint set
// with dowsectl moves the demo's Modbus controller and the setpoint and the
// temperature following it come back as reported (the demo checks both),
// then a few availability flips. The demo itself checks that every OFFLINE
// removed all Instances and every ONLINE brought them all back, and exits
// non-zero otherwise.
func TestDemo(t *testing.T) {
	// Built first, outside the demo's time limit: compiling it beside
	// the other packages' tests took most of three minutes in CI. Run
	// directly, not under `go run`, so that the time limit reaches the demo
	// itself, as an interrupt it stops its processes on.
	demo := filepath.Join(t.TempDir(), "demo")
	build := exec.Command("go", "build", "-o", demo, "./hack/demo")
	build.Dir = kube.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building hack/demo: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, demo, "--node", "off", "--flips", "4", "--flip-every", "2s")
	cmd.Dir = kube.RepoRoot()
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	out, err := cmd.CombinedOutput()
	t.Logf("demo output:\n%s", out)
	if err != nil {
		t.Fatalf("demo failed: %v (needs `make build` and `make k8s` first)", err)
	}
	for _, want := range []string{"agent joined the cloud/edge link with the bootstrap token",
		"holding register 0 (setpoint) written: 30",
		"the reported value followed the desired one: setpoint 30 reported, temperature 30 reported",
		"4 flips checked", "availability file -> OFFLINE", "dowsectl console --kubeconfig", "availability file -> ONLINE", "stopping dowse-agent"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}
