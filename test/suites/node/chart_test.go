package node

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestChartOnNode installs the Helm chart on the real node with bin/helm:
// the agent, the debug-echo handler and the controller run as the chart's
// pods (from locally built images), a sample Configuration's devices become
// Instances, a pod asking for one gets it through the agent's device plugin
// and CDI, the agent joins the cloud/edge link with the CA the chart made
// and its pod's service account token, a serial device reaches the Modbus
// mapper Pod the controller runs (testSerialMapper), the chart's Modbus RTU
// handler opens, unprivileged, a serial port a slot gives it
// (testSerialRTUHandler), the MQTT mapper runs as the Pod the controller
// makes from the sample (testMQTTMapperPod), and `helm uninstall`
// leaves none of the chart's objects or pods (but the link CA's Secret,
// kept on purpose).
// The node has no pod network: the chart's hostNetwork and probeHost keep
// the pods on loopback, on ports picked free.
func TestChartOnNode(t *testing.T) {
	kube.RequireHelm(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := startCluster(t, ctx,
		[2]string{"./agent/cmd/dowse-agent", "ghcr.io/dowse-dev/dowse-agent:latest"},
		[2]string{"./controller/cmd/dowse-controller", "ghcr.io/dowse-dev/dowse-controller:latest"},
		[2]string{"./discovery-handlers/debug-echo/cmd/dowse-debug-echo-discovery", "ghcr.io/dowse-dev/dowse-debug-echo-discovery:latest"},
		[2]string{"./discovery-handlers/modbus/cmd/dowse-modbus-rtu-discovery", "ghcr.io/dowse-dev/dowse-modbus-rtu-discovery:latest"},
		mapperImage, mqttMapperImage)
	cl := newClient(t, c)

	api := strings.TrimPrefix(c.Config.Host, "https://")
	apiHost, apiPort, _ := strings.Cut(api, ":")
	var ports [8]int
	for i := range ports {
		var err error
		if ports[i], err = procs.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	apiEnv := []map[string]string{{"name": "KUBERNETES_SERVICE_HOST", "value": apiHost}, {"name": "KUBERNETES_SERVICE_PORT", "value": apiPort}}
	values := map[string]any{
		"image":           map[string]any{"tag": "latest", "pullPolicy": "Never"},
		"hostNetwork":     true,
		"probeHost":       "127.0.0.1",
		"stateDir":        filepath.Join(c.StateDir, "dowse"),
		"cdiSpecDir":      c.CDIDir,
		"devicePluginDir": "/var/lib/kubelet/device-plugins",
		"podResourcesDir": filepath.Join(c.StateDir, "kubelet", "pod-resources"),
		"agent":           map[string]any{"env": apiEnv, "ports": map[string]any{"metrics": ports[0], "health": ports[1]}},
		"controller": map[string]any{"env": apiEnv, "replicas": 1, "ports": map[string]any{"metrics": ports[2], "health": ports[3]},
			"extraArgs": []string{"--pprof-bind-address=0"}},
		// The link with the CA the chart makes: the agent pins its
		// certificate and joins with its pod's service account token.
		"link": map[string]any{"enabled": true, "hosts": []string{"127.0.0.1"}, "quic": false,
			"ports": map[string]any{"websocket": ports[4], "auth": ports[5]}},
		"debugEcho": map[string]any{"discovery": map[string]any{"enabled": true, "metricsPort": ports[6]}},
		// Its pod waits for the serial-ports slot testSerialRTUHandler makes.
		"modbusRtu": map[string]any{"discovery": map[string]any{"enabled": true, "metricsPort": ports[7], "supplementalGroups": []int{20},
			"resources": map[string]any{"limits": map[string]any{serialPortsResource: 1}}}},
	}
	raw, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	valuesFile := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(valuesFile, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	helm := func(args ...string) string {
		t.Helper()
		cmd := kube.HelmCommand(ctx, t, append(args, "--kubeconfig", c.Kubeconfig)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	t.Log(helm("install", "dowse", filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse"),
		"--namespace", "dowse-system", "--create-namespace", "--values", valuesFile))

	waitReady(t, ctx, cl, "dowse-system", []string{"dowse-agent", "dowse-debug-echo-discovery", "dowse-controller"})

	waitMetric(t, ctx, ports[2], "dowse_cloudhub_connected_nodes 1")

	cfg := loadSample(t, "debug-echo.yaml")
	if err := cl.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitInstances(t, ctx, cl, cfg.Name, 2)
	checkAgentRestricted(t, ctx, c.Client, c.Config, cl, cfg)
	// The handler's own metrics: the agent's stream, and the devices sent.
	waitMetric(t, ctx, ports[6], `dowse_handler_discover_streams{handler="debug-echo"} 1`)
	waitMetric(t, ctx, ports[6], `dowse_handler_devices{handler="debug-echo"} 2`)

	res := corev1.ResourceName(v1alpha1.ResourceName(cfg.Namespace, cfg.Name))
	p := probePod("chart-device", "env:DEBUG_ECHO_DESCRIPTION", "env:GREETING")
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{res: resource.MustParse("1")}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodPhase(t, ctx, c.Client, p.Name, corev1.PodSucceeded)
	logs := podLogs(t, ctx, c.Client, p.Name)
	if !strings.Contains(logs, "env DEBUG_ECHO_DESCRIPTION=foo") || !strings.Contains(logs, "env GREETING=hello") {
		t.Fatalf("the pod did not get its device's environment through the chart's agent:\n%s", logs)
	}
	if err := c.Client.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A serial device reaches the mapper Pod the controller runs.
	t.Run("SerialMapper", func(t *testing.T) { testSerialMapper(t, ctx, c, cl, filepath.Join(c.StateDir, "dowse")) })
	// The Modbus RTU handler opens a serial port a slot gives it.
	t.Run("SerialRTUHandler", func(t *testing.T) { testSerialRTUHandler(t, ctx, c, cl, filepath.Join(c.StateDir, "dowse")) })
	// The MQTT mapper runs as the Pod the controller makes from the sample.
	t.Run("MQTTMapperPod", func(t *testing.T) { testMQTTMapperPod(t, ctx, c, cl, filepath.Join(c.StateDir, "dowse")) })
	// The Configuration goes first, while the agent still runs to let go
	// of its Instances; then the release.
	if err := cl.Delete(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitInstances(t, ctx, cl, cfg.Name, 0)
	// The check below sees the release while it is installed.
	if before := leftovers(ctx, t, cl); len(before) < 10 {
		t.Fatalf("the leftover check sees only %v of the installed release", before)
	}
	t.Log(helm("uninstall", "dowse", "--namespace", "dowse-system", "--wait", "--timeout", "2m"))
	// Every kind the API server serves, not only those leftovers names.
	waitUninstalled(t, ctx, c.Config, "dowse-system")
}

// checkAgentRestricted shows the chart's node policy live: with a token
// bound to the chart's agent pod (what its kubelet projects), the agent may
// not write another node's Instance, while its own Instances came through.
func checkAgentRestricted(t *testing.T, ctx context.Context, cs kubernetes.Interface, admin *rest.Config, cl client.Client, cfg *v1alpha1.Configuration) {
	t.Helper()
	pods, err := cs.CoreV1().Pods("dowse-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=dowse-agent"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("agent pods: %v (%v)", pods, err)
	}
	token, err := kube.PodToken(ctx, cs, &pods.Items[0])
	if err != nil {
		t.Fatal(err)
	}
	agent, err := client.New(kube.WithToken(admin, token), client.Options{Scheme: cl.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	forged := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Name + "-forged", Namespace: cfg.Namespace},
		Spec:       v1alpha1.InstanceSpec{ConfigurationName: cfg.Name, DeviceID: "forged", Shared: true},
		Status:     v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: "another-node"}}},
	}
	err = agent.Create(ctx, forged, client.DryRunAll)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "instance-create:") {
		t.Fatalf("the chart's agent credentials wrote another node's Instance: %v", err)
	}
	var list v1alpha1.InstanceList
	if err := cl.List(ctx, &list, client.InNamespace(cfg.Namespace), client.HasLabels{v1alpha1.NodeLabel(pods.Items[0].Spec.NodeName)}); err != nil || len(list.Items) == 0 {
		t.Fatalf("no Instance carries the agent's node label %s: %v", v1alpha1.NodeLabel(pods.Items[0].Spec.NodeName), err)
	}
}

// leftovers names the chart's objects and pods still there.
func leftovers(ctx context.Context, t *testing.T, cl client.Client) []string {
	t.Helper()
	var left []string
	sel := client.MatchingLabels{"app.kubernetes.io/part-of": "dowse"}
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace("dowse-system")); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		left = append(left, "pod "+p.Name)
	}
	for _, l := range []client.ObjectList{&corev1.ServiceAccountList{}, &corev1.ServiceList{}, &corev1.ConfigMapList{},
		&appsv1.DaemonSetList{}, &appsv1.DeploymentList{}, &policyv1.PodDisruptionBudgetList{}, &rbacv1.RoleList{}, &rbacv1.RoleBindingList{}} {
		if err := cl.List(ctx, l, client.InNamespace("dowse-system"), sel); err != nil {
			t.Fatal(err)
		}
		left = append(left, names(t, l)...)
	}
	for _, l := range []client.ObjectList{&rbacv1.ClusterRoleList{}, &rbacv1.ClusterRoleBindingList{}} {
		if err := cl.List(ctx, l, sel); err != nil {
			t.Fatal(err)
		}
		left = append(left, names(t, l)...)
	}
	var insts v1alpha1.InstanceList
	if err := cl.List(ctx, &insts); err != nil {
		t.Fatal(err)
	}
	for _, in := range insts.Items {
		left = append(left, "instance "+in.Name)
	}
	return left
}

func names(t *testing.T, l client.ObjectList) []string {
	t.Helper()
	items, err := meta.ExtractList(l)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, it := range items {
		o, err := meta.Accessor(it)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%T %s", it, o.GetName()))
	}
	return out
}

// waitReady waits until a pod of each named part (app.kubernetes.io/name)
// runs with every container ready, and says which are not when time is up.
func waitReady(t *testing.T, ctx context.Context, cl client.Client, ns string, parts []string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var pods corev1.PodList
		if err := cl.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		ready := map[string]bool{}
		var states []string
		for _, p := range pods.Items {
			ok := p.Status.Phase == corev1.PodRunning
			for _, cs := range p.Status.ContainerStatuses {
				ok = ok && cs.Ready
				if !cs.Ready {
					states = append(states, fmt.Sprintf("%s/%s not ready (%d restarts)", p.Name, cs.Name, cs.RestartCount))
				}
			}
			if ok {
				ready[p.Labels["app.kubernetes.io/name"]] = true
			}
			states = append(states, fmt.Sprintf("%s=%s", p.Name, p.Status.Phase))
		}
		all := true
		for _, part := range parts {
			all = all && ready[part]
		}
		if all {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			var events corev1.EventList
			_ = cl.List(ctx, &events, client.InNamespace(ns))
			for _, e := range events.Items {
				if e.Type == corev1.EventTypeWarning {
					states = append(states, fmt.Sprintf("%s: %s %s", e.InvolvedObject.Name, e.Reason, e.Message))
				}
			}
			t.Fatalf("the chart's pods are not all ready: %v", states)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitMetric waits until the metrics on 127.0.0.1:port have line.
func waitMetric(t *testing.T, ctx context.Context, port int, line string) {
	t.Helper()
	waitMetricAt(t, ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), line)
}

// waitMetricAt waits until the metrics on addr (host:port) have line.
func waitMetricAt(t *testing.T, ctx context.Context, addr, line string) {
	t.Helper()
	testwait.For(t, time.Minute, func() error { return hasMetric(ctx, addr, line) })
}

// hasMetric says whether the metrics on addr (host:port) have line.
func hasMetric(ctx context.Context, addr, line string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("metrics on %s: %w", addr, err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) == line {
			return nil
		}
	}
	return fmt.Errorf("metrics on %s have no %q", addr, line)
}
