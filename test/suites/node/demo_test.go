package node

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/kube"
)

// TestDemoOnNode runs `make demo`'s program on the real node: the agent with
// the debug-echo and Modbus handlers and the controller run as pods from
// locally built images installed with the Helm chart; a broker pod gets its
// device through the device plugin and CDI (the demo checks the broker's
// environment holds the CDI spec's env); a desired setpoint set with
// dowsectl moves the demo's Modbus controller and the setpoint and the
// temperature following it come back as reported (the demo checks both);
// and each availability flip removes or restores every Instance.
func TestDemoOnNode(t *testing.T) {
	requireNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "./hack/demo", "--node", "on", "--flips", "2", "--flip-every", "3s")
	cmd.Dir = kube.RepoRoot()
	out, err := cmd.CombinedOutput()
	t.Logf("demo output:\n%s", out)
	if err != nil {
		t.Fatalf("demo on the node failed: %v", err)
	}
	for _, want := range []string{"controller pods are Running", "agent joined the cloud/edge link",
		"the broker pod's environment has the device from the CDI spec: DEBUG_ECHO_DESCRIPTION=foo0",
		"holding register 0 (setpoint) written: 30",
		"the reported value followed the desired one: setpoint 30 reported, temperature 30 reported",
		"2 flips checked", "nodes [localhost]", "stopping the cluster"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}
