package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/promtest"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/modbusplc"
)

// earlierChart is the commit whose chart the upgrade starts from: the last
// before Configurations' status.nodes gained skipped (a CRD field) and the
// chart its hooks.
const earlierChart = "6af700d"

// TestChartLifecycleOnNode runs Dowse's life on the real node, on one
// cluster: the chart of an earlier commit (taken from git) is installed;
// debug-echo with broker Pods and a Modbus controller with a twin (its
// mapper Pod run by the controller) are applied; `helm upgrade` to this
// chart brings the CRDs up to date (the hook) and keeps every Instance,
// Device and broker Pod, and the twin still moves; every metric the
// dashboard and alerts query is served by the agent or the controller;
// `helm uninstall`, with nothing deleted first, leaves no Dowse object and
// nothing Terminating. Then again with the agent DaemonSet deleted before
// the uninstall: the hook drops the gone agents' finalizers.
func TestChartLifecycleOnNode(t *testing.T) {
	kube.RequireHelm(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c := startCluster(t, ctx,
		[2]string{"./agent/cmd/dowse-agent", "ghcr.io/dowse-dev/dowse-agent:latest"},
		[2]string{"./controller/cmd/dowse-controller", "ghcr.io/dowse-dev/dowse-controller:latest"},
		[2]string{"./discovery-handlers/debug-echo/cmd/dowse-debug-echo-discovery", "ghcr.io/dowse-dev/dowse-debug-echo-discovery:latest"},
		[2]string{"./discovery-handlers/modbus/cmd/dowse-modbus-discovery", "ghcr.io/dowse-dev/dowse-modbus-discovery:latest"},
		[2]string{"./mappers/modbus/cmd/dowse-modbus-mapper", "ghcr.io/dowse-dev/dowse-modbus-mapper:latest"},
		[2]string{"./brokers/debug-echo/cmd/dowse-debug-echo-broker", "ghcr.io/dowse-dev/dowse-debug-echo-broker:latest"})
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
	if err := apiextensionsv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}

	// The earlier commit's chart, from git.
	old := t.TempDir()
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive %s deploy/helm/dowse | tar -x -C %q", kube.RepoRoot(), earlierChart, old))
	if b, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("the chart of %s from git: %v\n%s", earlierChart, err, b)
	}
	oldChart := filepath.Join(old, "deploy", "helm", "dowse")

	valuesFile, ports := nodeValues(t, c, map[string]any{
		"debugEcho": map[string]any{"discovery": map[string]any{"enabled": true}},
		"modbus":    map[string]any{"discovery": map[string]any{"enabled": true}},
	})
	helm := func(args ...string) string {
		t.Helper()
		start := time.Now()
		out, err := kube.HelmCommand(ctx, t, append(args, "--kubeconfig", c.Kubeconfig)...).CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("helm %s: %v", args[0], time.Since(start).Round(100*time.Millisecond))
		return string(out)
	}
	parts := []string{"dowse-agent", "dowse-controller", "dowse-debug-echo-discovery", "dowse-modbus-discovery"}
	helm("install", "dowse", oldChart, "--namespace", "dowse-system", "--create-namespace", "--values", valuesFile)
	waitReady(t, ctx, cl, "dowse-system", parts)
	waitMetric(t, ctx, ports.controllerMetrics, "dowse_cloudhub_connected_nodes 1")

	plc, err := modbusplc.Start(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plc.Stop()
	echo, modbus := applyWorkloads(t, ctx, cl, plc.Addr)
	dev := waitTwin(t, ctx, cl, "setpoint", "21")
	before := uids(t, ctx, cl)
	t.Logf("before the upgrade: %d Instances, %d Devices, %d broker Pods, %d mapper Pods", len(before.instances), len(before.devices), len(before.pods), len(before.mappers))

	// The upgrade: CRDs up to date, nothing lost, the twin still moves.
	crdBefore := &apiextensionsv1.CustomResourceDefinition{}
	if err := cl.Get(ctx, client.ObjectKey{Name: "configurations.dowse.dev"}, crdBefore); err != nil {
		t.Fatal(err)
	}
	if hasSkipped(crdBefore) {
		t.Fatalf("the earlier chart's Configuration CRD already has status.nodes[].skipped: pick an earlier commit")
	}
	helm("upgrade", "dowse", filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse"), "--namespace", "dowse-system", "--values", valuesFile, "--wait", "--timeout", "3m")
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := cl.Get(ctx, client.ObjectKey{Name: "configurations.dowse.dev"}, crd); err != nil {
		t.Fatal(err)
	}
	if !hasSkipped(crd) {
		t.Error("helm upgrade left the Configuration CRD without status.nodes[].skipped")
	}
	waitReady(t, ctx, cl, "dowse-system", parts)
	waitMetric(t, ctx, ports.controllerMetrics, "dowse_cloudhub_connected_nodes 1")
	after := uids(t, ctx, cl)
	for what, m := range map[string][2]map[string]types.UID{"Instance": {before.instances, after.instances}, "Device": {before.devices, after.devices}, "broker Pod": {before.pods, after.pods}} {
		for n, uid := range m[0] {
			if m[1][n] != uid {
				t.Errorf("%s %s was %s before the upgrade and is %q after", what, n, uid, m[1][n])
			}
		}
	}
	setDesired(t, ctx, cl, dev, "setpoint", "30")
	waitTwin(t, ctx, cl, "setpoint", "30")
	// The earlier chart's mapper Pods lack the socket folder's group, so the
	// upgrade may remake them (old first: a hostNetwork mapper's ports and
	// its name on the DMI socket are its own); the twin moving is their
	// proof, and each still has its Pod.
	after = uids(t, ctx, cl)
	for n, uid := range before.mappers {
		switch now, ok := after.mappers[n]; {
		case !ok:
			t.Errorf("mapper Pod of %s gone after the upgrade", n)
		case now != uid:
			t.Logf("mapper Pod of %s remade by the upgrade (%s, was %s)", n, now, uid)
		}
	}
	t.Log("after the upgrade the same Instances, Devices and broker Pods; the twin moved to 30")

	// The handler skips the unanswering target: the status says so.
	eventuallyNode(t, ctx, 30*time.Second, func() error {
		var cfg v1alpha1.Configuration
		if err := cl.Get(ctx, client.ObjectKeyFromObject(modbus), &cfg); err != nil {
			return err
		}
		for _, n := range cfg.Status.Nodes {
			for _, s := range n.Skipped {
				if s.Reason == "NoReply" {
					return nil
				}
			}
		}
		return fmt.Errorf("no NoReply in %+v", cfg.Status.Nodes)
	})

	// Every metric the dashboard and the alerts query is served.
	served := promtest.Families(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", ports.agentMetrics))
	for k := range promtest.Families(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", ports.controllerMetrics)) {
		served[k] = true
	}
	chart := filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse")
	for _, m := range promtest.QueriedMetrics(t, filepath.Join(chart, "files", "dashboard.json"), filepath.Join(chart, "files", "rules.yaml")) {
		if !served[m] {
			t.Errorf("the dashboard or the alerts query %s, which neither the agent nor the controller serves", m)
		}
	}

	// helm uninstall with everything in place.
	_ = echo
	start := time.Now()
	helm("uninstall", "dowse", "--namespace", "dowse-system", "--wait", "--timeout", "3m")
	waitUninstalled(t, ctx, c.Config, "dowse-system")
	t.Logf("uninstalled, nothing left, in %v", time.Since(start).Round(100*time.Millisecond))

	// Again, with the agents gone before the uninstall.
	helm("install", "dowse", chart, "--namespace", "dowse-system", "--create-namespace", "--values", valuesFile)
	waitReady(t, ctx, cl, "dowse-system", parts)
	cfg := loadSample(t, "debug-echo.yaml")
	if err := cl.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitInstances(t, ctx, cl, cfg.Name, 2)
	if err := c.Client.AppsV1().DaemonSets("dowse-system").Delete(ctx, "dowse-agent", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventuallyNode(t, ctx, 2*time.Minute, func() error {
		pods, err := c.Client.CoreV1().Pods("dowse-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=dowse-agent"})
		if err != nil || len(pods.Items) > 0 {
			return fmt.Errorf("agent pods %d (%w)", len(pods.Items), err)
		}
		return nil
	})
	start = time.Now()
	helm("uninstall", "dowse", "--namespace", "dowse-system", "--wait", "--timeout", "3m")
	waitUninstalled(t, ctx, c.Config, "dowse-system")
	t.Logf("with the agents deleted first: uninstalled, nothing left, in %v", time.Since(start).Round(100*time.Millisecond))
}

type nodePorts struct{ agentMetrics, controllerMetrics int }

// nodeValues writes the values of a release on the test node (host network,
// loopback probes, free ports, the link on, the agent's state, CDI specs and
// the kubelet's pod-resources socket inside the cluster's directory, not
// the machine's) with extra merged in.
func nodeValues(t *testing.T, c *cluster.Cluster, extra map[string]any) (string, nodePorts) {
	t.Helper()
	api := strings.TrimPrefix(c.Config.Host, "https://")
	apiHost, apiPort, _ := strings.Cut(api, ":")
	var p [9]int
	for i := range p {
		var err error
		if p[i], err = procs.FreePort(); err != nil {
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
		"podResourcesDir": filepath.Join(c.StateDir, "kubelet", "pod-resources"),
		"agent":           map[string]any{"env": apiEnv, "ports": map[string]any{"metrics": p[0], "health": p[1]}},
		"controller": map[string]any{"env": apiEnv, "replicas": 1, "ports": map[string]any{"metrics": p[2], "health": p[3]},
			"extraArgs": []string{"--pprof-bind-address=0"}, "nodeGracePeriod": "20s"},
		"link": map[string]any{"enabled": true, "hosts": []string{"127.0.0.1"}, "quic": false,
			"ports": map[string]any{"websocket": p[4], "auth": p[5]}},
	}
	next := 6
	for k, v := range extra {
		m := v.(map[string]any)
		if d, ok := m["discovery"].(map[string]any); ok && next < len(p) {
			d["metricsPort"] = p[next]
			next++
		}
		values[k] = m
	}
	raw, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return f, nodePorts{agentMetrics: p[0], controllerMetrics: p[2]}
}

// applyWorkloads applies debug-echo with broker Pods (on a free port) and
// the Modbus sample with its model, scanning plc and a port nobody answers.
func applyWorkloads(t *testing.T, ctx context.Context, cl client.Client, plc string) (*v1alpha1.Configuration, *v1alpha1.Configuration) {
	t.Helper()
	echo := loadSample(t, "debug-echo-broker-pod.yaml")
	bport, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	bc := &echo.Spec.BrokerSpec.BrokerPodSpec.Containers[0]
	bc.Args[0] = fmt.Sprintf("--listen=:%d", bport)
	bc.Ports[0].ContainerPort = int32(bport)
	bc.ImagePullPolicy = corev1.PullNever
	if err := cl.Create(ctx, echo); err != nil {
		t.Fatal(err)
	}
	closed, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	modbus := applyModbus(t, ctx, cl, []string{plc, fmt.Sprintf("127.0.0.1:%d", closed)}, nil)
	waitInstances(t, ctx, cl, echo.Name, 1)
	return echo, modbus
}

// applyModbus applies the Modbus sample with its model, scanning targets,
// its mapper Pod changed by mapperPod (nil: as the sample has it) after
// its metrics port is set and its image never pulled.
func applyModbus(t *testing.T, ctx context.Context, cl client.Client, targets []string, mapperPod func(*corev1.PodSpec)) *v1alpha1.Configuration {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(kube.RepoRoot(), "samples", "modbus-plc-model.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var model v1alpha1.DeviceModel
	if err := yaml.Unmarshal(raw, &model); err != nil {
		t.Fatal(err)
	}
	model.Namespace = "default"
	if err := cl.Create(ctx, &model); err != nil {
		t.Fatal(err)
	}
	modbus := loadSample(t, "modbus-plc.yaml")
	var details map[string]any
	if err := json.Unmarshal(modbus.Spec.DiscoveryHandler.DiscoveryDetails.Raw, &details); err != nil {
		t.Fatal(err)
	}
	details["targets"] = targets
	modbus.Spec.DiscoveryHandler.DiscoveryDetails.Raw, _ = json.Marshal(details)
	mport, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	mc := &modbus.Spec.DeviceTemplate.MapperPodSpec.Containers[0]
	mc.Args = []string{fmt.Sprintf("--metrics-address=127.0.0.1:%d", mport)}
	mc.Ports = []corev1.ContainerPort{{Name: "metrics", ContainerPort: int32(mport)}}
	mc.ImagePullPolicy = corev1.PullNever
	if mapperPod != nil {
		mapperPod(modbus.Spec.DeviceTemplate.MapperPodSpec)
	}
	if err := cl.Create(ctx, modbus); err != nil {
		t.Fatal(err)
	}
	return modbus
}

// waitTwin waits for the one Device to report prop as value.
func waitTwin(t *testing.T, ctx context.Context, cl client.Client, prop, value string) *v1alpha1.Device {
	t.Helper()
	var dev v1alpha1.Device
	eventuallyNode(t, ctx, 2*time.Minute, func() error {
		var l v1alpha1.DeviceList
		if err := cl.List(ctx, &l, client.InNamespace("default")); err != nil {
			return err
		}
		if len(l.Items) != 1 {
			return fmt.Errorf("%d Devices", len(l.Items))
		}
		dev = l.Items[0]
		for _, tw := range dev.Status.Twins {
			if tw.PropertyName == prop && tw.Reported != nil && tw.Reported.Value == value {
				return nil
			}
		}
		return fmt.Errorf("%s not reported %s: %+v", prop, value, dev.Status.Twins)
	})
	return &dev
}

func setDesired(t *testing.T, ctx context.Context, cl client.Client, dev *v1alpha1.Device, prop, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"properties":[{"name":%q,"desired":{"value":%q}}]}}`, prop, value)
	eventuallyNode(t, ctx, 30*time.Second, func() error {
		var cur v1alpha1.Device
		if err := cl.Get(ctx, client.ObjectKeyFromObject(dev), &cur); err != nil {
			return err
		}
		return cl.Patch(ctx, &cur, client.RawPatch(types.MergePatchType, []byte(patch)))
	})
}

// snapshot holds UIDs by namespace/name; mappers by namespace/Configuration
// and node, as a remade mapper Pod has a new name.
type snapshot struct{ instances, devices, pods, mappers map[string]types.UID }

// uids are the Instances', Devices' and broker and mapper Pods' UIDs.
func uids(t *testing.T, ctx context.Context, cl client.Client) snapshot {
	t.Helper()
	s := snapshot{map[string]types.UID{}, map[string]types.UID{}, map[string]types.UID{}, map[string]types.UID{}}
	var insts v1alpha1.InstanceList
	var devs v1alpha1.DeviceList
	var pods corev1.PodList
	if err := cl.List(ctx, &insts); err != nil {
		t.Fatal(err)
	}
	if err := cl.List(ctx, &devs); err != nil {
		t.Fatal(err)
	}
	if err := cl.List(ctx, &pods, client.HasLabels{v1alpha1.LabelConfiguration}); err != nil {
		t.Fatal(err)
	}
	for _, i := range insts.Items {
		s.instances[i.Namespace+"/"+i.Name] = i.UID
	}
	for _, d := range devs.Items {
		s.devices[d.Namespace+"/"+d.Name] = d.UID
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if p.Labels[v1alpha1.LabelMapper] == "true" {
			s.mappers[p.Namespace+"/"+p.Labels[v1alpha1.LabelConfiguration]+" on "+p.Spec.NodeName] = p.UID
			continue
		}
		s.pods[p.Namespace+"/"+p.Name] = p.UID
	}
	if len(s.instances) == 0 || len(s.devices) == 0 || len(s.pods) == 0 || len(s.mappers) == 0 {
		t.Fatalf("too little to compare: %+v", s)
	}
	return s
}

// hasSkipped says whether the CRD's schema has status.nodes[].skipped.
func hasSkipped(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, v := range crd.Spec.Versions {
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		st := v.Schema.OpenAPIV3Schema.Properties["status"]
		nodes := st.Properties["nodes"]
		if nodes.Items != nil && nodes.Items.Schema != nil {
			if _, ok := nodes.Items.Schema.Properties["skipped"]; ok {
				return true
			}
		}
	}
	return false
}

func eventuallyNode(t *testing.T, ctx context.Context, d time.Duration, f func() error) {
	t.Helper()
	testwait.For(t, d, func() error {
		if err := ctx.Err(); err != nil {
			t.Fatalf("%v while waiting", err)
		}
		return f()
	})
}
