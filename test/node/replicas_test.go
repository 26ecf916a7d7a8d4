package node

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/controller/ownership"
	"github.com/dowse-dev/dowse/shared/scheme"
	"github.com/dowse-dev/dowse/test/kube"
	"github.com/dowse-dev/dowse/test/procs"
)

// postRenderEnv makes this test binary Helm's post-renderer (TestMain): it
// reads the rendered manifests on stdin and writes them back changed by
// sharedHostNetwork.
const postRenderEnv = "DOWSE_NODE_TEST_POST_RENDER"

func TestMain(m *testing.M) {
	if os.Getenv(postRenderEnv) != "" {
		if err := sharedHostNetwork(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "post-render:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// sharedHostNetwork lets the chart's two controller replicas share the
// test node's one host network. Each replica serves metrics, health probes
// and the link, so on a host network two of them on one node contend for
// those ports, and their declared container ports become host ports, which
// keep the scheduler from putting the second replica on the node at all.
// On a real cluster the replicas have a pod network or a node each; here
// the controller's metrics and probes are turned off and its ports left
// undeclared. The link's ports stay shared: one replica at a time listens
// on them (the other's cloudhub retries until the port is free). Leader
// election and the link's Service are the chart's own.
func sharedHostNetwork(in io.Reader, out io.Writer) error {
	raw, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	var docs []string
	for _, doc := range strings.Split(string(raw), "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return err
		}
		if obj == nil {
			continue
		}
		if meta, _ := obj["metadata"].(map[string]any); obj["kind"] == "Deployment" && meta["name"] == "dowse-controller" {
			tmpl := obj["spec"].(map[string]any)["template"].(map[string]any)
			for _, c := range tmpl["spec"].(map[string]any)["containers"].([]any) {
				c := c.(map[string]any)
				delete(c, "ports")
				delete(c, "livenessProbe")
				delete(c, "readinessProbe")
				var args []any
				for _, a := range c["args"].([]any) {
					s := a.(string)
					switch {
					case strings.HasPrefix(s, "--metrics-bind-address="):
						s = "--metrics-bind-address=0"
					case strings.HasPrefix(s, "--health-probe-bind-address="):
						s = "--health-probe-bind-address=0"
					}
					args = append(args, s)
				}
				c["args"] = append(args, "--pprof-bind-address=0")
			}
		}
		b, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		docs = append(docs, string(b))
	}
	_, err = io.WriteString(out, "---\n"+strings.Join(docs, "---\n"))
	return err
}

// TestChartReplicasOnNode installs the chart with its default two
// controller replicas and leader election on the real node: the agent
// joins the link, the replica that serves it holds the node's ownership
// record and is named ready by the dowse-cloudhub Service's EndpointSlice;
// when that replica's Pod is deleted the other one takes the agent's
// session (a new holder of the record, the agent told its device
// membership again). `helm uninstall` then leaves nothing of the release
// (waitUninstalled).
//
// What it cannot show on this node: the test node has no pod network, so
// both replicas are on the host's network and share the link's port (the
// agent reaches whichever listens, at 127.0.0.1, not through the Service:
// there is no kube-proxy either), and the twins are not exercised here
// (test/e2e TestReplicas moves twins between three replicas as processes).
func TestChartReplicasOnNode(t *testing.T) {
	kube.RequireHelm(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	c := startCluster(t, ctx,
		[2]string{"./agent/cmd/dowse-agent", "ghcr.io/dowse-dev/dowse-agent:latest"},
		[2]string{"./controller/cmd/dowse-controller", "ghcr.io/dowse-dev/dowse-controller:latest"})
	t.Cleanup(func() {
		_ = c.Stop()
		if !t.Failed() {
			_ = os.RemoveAll(c.StateDir)
		}
	})
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.Config, client.Options{Scheme: sch})
	if err != nil {
		t.Fatal(err)
	}
	api := strings.TrimPrefix(c.Config.Host, "https://")
	apiHost, apiPort, _ := strings.Cut(api, ":")
	var ports [4]int
	for i := range ports {
		if ports[i], err = procs.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	agentMetrics := ports[0]
	apiEnv := []map[string]string{{"name": "KUBERNETES_SERVICE_HOST", "value": apiHost}, {"name": "KUBERNETES_SERVICE_PORT", "value": apiPort}}
	values := map[string]any{
		"image":           map[string]any{"tag": "latest", "pullPolicy": "Never"},
		"hostNetwork":     true,
		"probeHost":       "127.0.0.1",
		"stateDir":        filepath.Join(c.StateDir, "dowse"),
		"cdiSpecDir":      c.CDIDir,
		"devicePluginDir": "/var/lib/kubelet/device-plugins",
		"podResourcesDir": filepath.Join(c.StateDir, "kubelet", "pod-resources"),
		"agent":           map[string]any{"env": apiEnv, "ports": map[string]any{"metrics": agentMetrics, "health": ports[1]}},
		// The chart's own replicas (2) and leader election.
		"controller": map[string]any{"env": apiEnv},
		"link": map[string]any{"enabled": true, "hosts": []string{"127.0.0.1"}, "quic": false,
			"ports": map[string]any{"websocket": ports[2], "auth": ports[3]}},
		"debugEcho": map[string]any{"discovery": map[string]any{"enabled": false}},
	}
	raw, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	valuesFile := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(valuesFile, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	helm := func(args ...string) {
		t.Helper()
		cmd := kube.HelmCommand(ctx, t, append(args, "--kubeconfig", c.Kubeconfig)...)
		cmd.Env = append(cmd.Env, postRenderEnv+"=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	helm("install", "dowse", filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse"),
		"--namespace", "dowse-system", "--create-namespace", "--values", valuesFile, "--post-renderer", self)

	holder := waitHolder(t, ctx, cl, "", func(pods []corev1.Pod) error {
		if len(pods) != 2 {
			return fmt.Errorf("%d controller pods running, want the chart's 2", len(pods))
		}
		return nil
	})
	t.Logf("the agent's session is on %s", holder)
	waitMetric(t, ctx, agentMetrics, "dowse_edgehub_connected 1")

	begin := time.Now()
	if err := c.Client.CoreV1().Pods("dowse-system").Delete(ctx, holder, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next := waitHolder(t, ctx, cl, holder, func(pods []corev1.Pod) error {
		for _, p := range pods {
			if p.Name == holder {
				return fmt.Errorf("the deleted holder %s still runs", holder)
			}
		}
		return nil
	})
	t.Logf("after deleting %s, %s holds the agent's session (%s)", holder, next, time.Since(begin).Round(100*time.Millisecond))
	// The old holder's process is gone with its Pod: a connected agent is
	// one that joined the other replica's link, which sent it its device
	// membership again (logged on every connection).
	waitMetric(t, ctx, agentMetrics, "dowse_edgehub_connected 1")
	var agents corev1.PodList
	if err := cl.List(ctx, &agents, client.InNamespace("dowse-system"), client.MatchingLabels{"app.kubernetes.io/name": "dowse-agent"}); err != nil || len(agents.Items) != 1 {
		t.Fatalf("agent pods %v: %v", agents.Items, err)
	}
	for n := 0; n < 2; {
		logs, err := c.Client.CoreV1().Pods("dowse-system").GetLogs(agents.Items[0].Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n = strings.Count(string(logs), "device membership from the cloud"); n < 2 && ctx.Err() != nil {
			t.Fatalf("the agent joined the link %d times, want 2 (the first holder's and the next one's):\n%s", n, logs)
		}
		time.Sleep(300 * time.Millisecond)
	}

	// Nothing of the release is left (but the link CA it keeps on
	// purpose), found by asking the API server for every kind it serves.
	helm("uninstall", "dowse", "--namespace", "dowse-system", "--wait", "--timeout", "2m")
	waitUninstalled(t, ctx, c.Config, "dowse-system")
}

// waitHolder waits until the node's ownership record is held by a running
// controller Pod other than old, the dowse-cloudhub Service's
// EndpointSlices name that Pod as ready, and check passes for the running
// controller Pods; it returns the holder's name.
func waitHolder(t *testing.T, ctx context.Context, cl client.Client, old string, check func([]corev1.Pod) error) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		name, err := holderNow(ctx, cl, old, check)
		if err == nil {
			return name
		}
		last = err
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("no running replica holds the node's session: %v", last)
	return ""
}

func holderNow(ctx context.Context, cl client.Client, old string, check func([]corev1.Pod) error) (string, error) {
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace("dowse-system"), client.MatchingLabels{"app.kubernetes.io/name": "dowse-controller"}); err != nil {
		return "", err
	}
	var running []string
	var live []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		live = append(live, p)
		running = append(running, p.Name)
	}
	if err := check(live); err != nil {
		return "", err
	}
	// The replica serving the node's session holds its ownership record.
	var leases coordinationv1.LeaseList
	if err := cl.List(ctx, &leases, client.InNamespace("dowse-system"), client.MatchingLabels{ownership.LabelKind: "node"}); err != nil {
		return "", err
	}
	var holders []string
	for _, l := range leases.Items {
		if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" {
			holders = append(holders, h)
		}
	}
	if len(holders) != 1 || holders[0] == old || !slices.Contains(running, holders[0]) {
		return "", fmt.Errorf("running controller pods %v, the node's session held by %v", running, holders)
	}
	var eps discoveryv1.EndpointSliceList
	if err := cl.List(ctx, &eps, client.InNamespace("dowse-system"), client.MatchingLabels{discoveryv1.LabelServiceName: "dowse-cloudhub"}); err != nil {
		return "", err
	}
	var named []string
	for _, s := range eps.Items {
		for _, e := range s.Endpoints {
			if e.TargetRef != nil && ptr.Deref(e.Conditions.Ready, false) {
				named = append(named, e.TargetRef.Name)
			}
		}
	}
	if !slices.Contains(named, holders[0]) {
		return "", fmt.Errorf("the dowse-cloudhub EndpointSlices name %v as ready, not the holder %s", named, holders[0])
	}
	return holders[0], nil
}
