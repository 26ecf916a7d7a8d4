package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

// helmPath is the Helm `make helm` builds from the module proxy.
func helmPath() string { return filepath.Join(kube.RepoRoot(), "bin", "helm") }

// installChart installs Dowse on the demo's node as a user would, with
// `helm install` of deploy/helm/dowse into dowse-system: the agent, the
// debug-echo and Modbus handlers and the controller from the locally built
// images, and
// the cloud/edge link with the CA the chart makes (the agent pins it and
// joins with its pod's service account token). The node has no pod network
// and no kube-proxy: the values put every pod on the host network, the
// probes on loopback, the API server at its loopback address, and the ports
// on free ones; the agent's state and CDI specs live under the cluster's
// state folder. It returns the link (its ports, for waitJoined).
func installChart(ctx context.Context, c *cluster.Cluster, state string) (*demoLink, error) {
	var ports [8]int
	for i := range ports {
		p, err := procs.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	api := strings.TrimPrefix(c.Config.Host, "https://")
	apiHost, apiPort, _ := strings.Cut(api, ":")
	apiEnv := []map[string]string{{"name": "KUBERNETES_SERVICE_HOST", "value": apiHost}, {"name": "KUBERNETES_SERVICE_PORT", "value": apiPort}}
	values := map[string]any{
		"image":           map[string]any{"tag": "latest", "pullPolicy": "Never"},
		"hostNetwork":     true,
		"probeHost":       "127.0.0.1",
		"stateDir":        state,
		"cdiSpecDir":      c.CDIDir,
		"devicePluginDir": "/var/lib/kubelet/device-plugins",
		"podResourcesDir": filepath.Join(c.StateDir, "kubelet", "pod-resources"),
		"agent":           map[string]any{"env": apiEnv, "ports": map[string]any{"metrics": ports[0], "health": ports[1]}},
		// One node, one host network: a second replica would contend for
		// the first one's ports.
		"controller": map[string]any{"env": apiEnv, "replicas": 1, "ports": map[string]any{"metrics": ports[2], "health": ports[3]}},
		"link": map[string]any{"enabled": true, "hosts": []string{"127.0.0.1"}, "quic": false,
			"ports": map[string]any{"websocket": ports[4], "auth": ports[5]}},
		"debugEcho": map[string]any{"discovery": map[string]any{"enabled": true, "metricsPort": ports[6]}},
		// The Modbus handler for the twin (showTwin); the mapper is the
		// one samples/modbus-plc.yaml has the controller run.
		"modbus": map[string]any{"discovery": map[string]any{"enabled": true, "metricsPort": ports[7]}},
	}
	raw, err := yaml.Marshal(values)
	if err != nil {
		return nil, err
	}
	valuesFile := filepath.Join(c.StateDir, "dowse-values.yaml")
	if err := os.WriteFile(valuesFile, raw, 0o600); err != nil {
		return nil, err
	}
	args := []string{"install", "dowse", filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse"),
		"--namespace", "dowse-system", "--create-namespace", "--values", valuesFile, "--kubeconfig", c.Kubeconfig}
	cmd := exec.CommandContext(ctx, helmPath(), args...)
	// Helm's caches and settings stay in the cluster's folder.
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(c.StateDir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(c.StateDir, "helm", "config"), "HELM_DATA_HOME="+filepath.Join(c.StateDir, "helm", "data"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	say("installed the chart: bin/helm install dowse deploy/helm/dowse -n dowse-system --values %s", valuesFile)
	return &demoLink{metricsPort: ports[2], how: "its pod's service account token"}, nil
}
