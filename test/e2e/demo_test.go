// Package e2e runs Dowse's real binaries as separate processes.
package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/kube"
)

// TestDemo runs `make demo`'s program with the real agent and debug-echo
// binaries for a few availability flips. The demo itself checks that every
// OFFLINE removed all Instances and every ONLINE brought them all back, and
// exits non-zero otherwise.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "./hack/demo", "--node", "off", "--flips", "4", "--flip-every", "2s")
	cmd.Dir = kube.RepoRoot()
	out, err := cmd.CombinedOutput()
	t.Logf("demo output:\n%s", out)
	if err != nil {
		t.Fatalf("demo failed: %v (needs `make build` and `make k8s` first)", err)
	}
	for _, want := range []string{"4 flips checked", "availability file -> OFFLINE", "availability file -> ONLINE", "stopping dowse-agent"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}
