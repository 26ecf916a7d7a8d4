package node

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/kube"
)

// TestDemoOnNode runs `make demo`'s program on the real node: the agent with
// the debug-echo handler and the controller run as pods from locally built
// images installed with the Helm chart, and the demo checks that each availability
// flip removes or restores every Instance.
func TestDemoOnNode(t *testing.T) {
	requireNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "./hack/demo", "--node", "on", "--flips", "2", "--flip-every", "3s")
	cmd.Dir = kube.RepoRoot()
	out, err := cmd.CombinedOutput()
	t.Logf("demo output:\n%s", out)
	if err != nil {
		t.Fatalf("demo on the node failed: %v", err)
	}
	for _, want := range []string{"controller pods are Running", "agent joined the cloud/edge link", "2 flips checked", "nodes [localhost]", "stopping the cluster"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}
