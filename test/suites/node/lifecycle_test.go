package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
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

// TestChartLifecycleOnNode runs Dowse's life on the real node, on one
// cluster with a real pod network, at the chart's defaults: two controller
// replicas with leader election, the agent reaching them through the
// dowse-cloudhub Service. The earlier release (earlierCommit's chart and
// images, built from git) is installed; debug-echo with broker Pods holding
// its device and a Modbus controller with a twin whose counter goes up five
// times a second (its mapper Pod run by the controller) are applied, both
// on the earlier release's images. `helm upgrade` to this chart and images,
// under that traffic, brings the CRDs up to date (the hook) and keeps every
// Instance, Device and broker Pod (the same Pod, no restart, its device's
// environment); Device.status never shows the counter going back and ends
// on its last value; the twin still moves. The rolling update replaces both
// controller replicas, so the node's session moves from the replica that
// held it to a new one (each holder logged) without a report lost. `helm
// rollback` to the earlier release: the same. Every metric the dashboard
// and alerts query is served by the agent or a controller replica; `helm
// uninstall` (after an upgrade again), with nothing deleted first, leaves
// no Dowse object and nothing Terminating. Then again with the agent
// DaemonSet deleted before the uninstall: the hook drops the gone agents'
// finalizers.
func TestChartLifecycleOnNode(t *testing.T) {
	kube.RequireHelm(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	images := [][2]string{
		{"./agent/cmd/dowse-agent", "ghcr.io/dowse-dev/dowse-agent:latest"},
		{"./controller/cmd/dowse-controller", "ghcr.io/dowse-dev/dowse-controller:latest"},
		{"./discovery-handlers/debug-echo/cmd/dowse-debug-echo-discovery", "ghcr.io/dowse-dev/dowse-debug-echo-discovery:latest"},
		{"./discovery-handlers/modbus/cmd/dowse-modbus-discovery", "ghcr.io/dowse-dev/dowse-modbus-discovery:latest"},
		{"./mappers/modbus/cmd/dowse-modbus-mapper", "ghcr.io/dowse-dev/dowse-modbus-mapper:latest"},
		{"./brokers/debug-echo/cmd/dowse-debug-echo-broker", "ghcr.io/dowse-dev/dowse-debug-echo-broker:latest"},
	}
	var earlier [][2]string
	for _, im := range images {
		earlier = append(earlier, [2]string{im[0], strings.TrimSuffix(im[1], ":latest") + ":" + earlierTag})
	}
	earlierImages, oldChart := earlierRelease(t, ctx, earlier)
	// The chart's own two controller replicas with leader election, on a
	// real pod network (as TestChartReplicasOnNode): each replica listens on
	// its own address, the agent reaches them through the dowse-cloudhub
	// Service.
	c := startClusterWith(t, ctx, cluster.Options{Images: earlierImages, PodNetwork: true}, images...)
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

	valuesFile := podNetworkValues(t, c, map[string]any{
		"debugEcho": map[string]any{"discovery": map[string]any{"enabled": true}},
		"modbus":    map[string]any{"discovery": map[string]any{"enabled": true}},
	})
	sessions := trackSessions(t, cl)
	helm := func(args ...string) {
		t.Helper()
		start := time.Now()
		out, err := kube.HelmCommand(ctx, t, append(args, "--kubeconfig", c.Kubeconfig)...).CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("helm %s: %v", args[0], time.Since(start).Round(100*time.Millisecond))
	}
	// rolling runs helm (upgrade or rollback) to the images tagged tag and,
	// once it has changed the agent DaemonSet (the release is rolling), sets
	// the twin's desired setpoint to value.
	rolling := func(tag string, dev *v1alpha1.Device, value string, args ...string) roll {
		t.Helper()
		r0 := roll{holder: sessionServed(t, ctx, cl).Name, replicas: controllerPods(t, ctx, cl)}
		begin := time.Now()
		type result struct {
			out []byte
			err error
		}
		done := make(chan result, 1)
		cmd := kube.HelmCommand(ctx, t, append(args, "--kubeconfig", c.Kubeconfig)...)
		go func() {
			out, err := cmd.CombinedOutput()
			done <- result{out, err}
		}()
		var r *result
		eventuallyNode(t, ctx, 2*time.Minute, func() error {
			select {
			case res := <-done:
				r = &res
				return nil
			default:
			}
			var ds appsv1.DaemonSet
			if err := cl.Get(ctx, client.ObjectKey{Namespace: "dowse-system", Name: "dowse-agent"}, &ds); err != nil {
				return err
			}
			if img := ds.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(img, ":"+tag) {
				return fmt.Errorf("the agent DaemonSet still has %s", img)
			}
			return nil
		})
		setDesired(t, ctx, cl, dev, "setpoint", value)
		if r == nil {
			res := <-done
			r = &res
		}
		if r.err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), r.err, r.out)
		}
		took := time.Since(begin)
		t.Logf("helm %s: %v (setpoint %s set while it rolled)", args[0], took.Round(100*time.Millisecond), value)
		r0.begin, r0.took = begin, took
		return r0
	}
	parts := []string{"dowse-agent", "dowse-controller", "dowse-debug-echo-discovery", "dowse-modbus-discovery"}
	helm("install", "dowse", oldChart, "--namespace", "dowse-system", "--create-namespace", "--values", valuesFile, "--set", "image.tag="+earlierTag)
	waitReady(t, ctx, cl, "dowse-system", parts)
	t.Logf("on the earlier release the node's session is held by %s", sessionServed(t, ctx, cl).Name)
	agentTagged(t, ctx, cl, earlierTag)

	// The PLC where the pod network reaches the machine.
	plc, err := modbusplc.StartOn(c.PodNetwork.HostIP, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plc.Stop()
	echo, modbus := applyWorkloads(t, ctx, cl, plc.Addr, workloadOptions{tag: earlierTag, counter: true, podNetwork: true})
	brokerPort := echo.Spec.BrokerSpec.BrokerPodSpec.Containers[0].Ports[0].ContainerPort
	dev := waitTwin(t, ctx, cl, "setpoint", "21")
	counter := watchCounter(t, c.Config, client.Options{Scheme: sch})
	eventuallyNode(t, ctx, time.Minute, func() error {
		if counter.last() < 1 {
			return fmt.Errorf("no counter in Device.status yet")
		}
		return nil
	})
	counterCaughtUp(t, ctx, counter, plc, "on the earlier release")
	before := uids(t, ctx, cl)
	brokers := brokerPods(t, ctx, cl, echo.Name, brokerPort)
	for _, b := range brokers {
		if b.ip == "" {
			t.Fatalf("the broker Pods are not on the pod network: %+v", brokers)
		}
	}
	t.Logf("on the earlier release (%s): %d Instances, %d Devices, %d broker Pods, %d mapper Pods; the counter at %d",
		earlierCommit, len(before.instances), len(before.devices), len(before.pods), len(before.mappers), counter.last())

	// The counter's steady reporting, for comparison with what an upgrade
	// and a rollback show.
	begin := time.Now()
	time.Sleep(10 * time.Second)
	figures := func(what string, took time.Duration, begin time.Time) {
		t.Helper()
		updates, advance, gap, gapAt := counter.window(begin, time.Now())
		if took > 0 {
			what += fmt.Sprintf(" (helm took %v; Pods started: %s)", took.Round(100*time.Millisecond), started(ctx, cl, "dowse-system", begin))
		}
		t.Logf("%s: over %v Device.status showed %d new counter values (the counter went up %d), the longest without a new one %v from +%v",
			what, time.Since(begin).Round(100*time.Millisecond), updates, advance, gap.Round(100*time.Millisecond), gapAt.Sub(begin).Round(100*time.Millisecond))
	}
	figures("steady, without helm", 0, begin)
	devices, err := readNodeDevices(ctx, cl, c.CDIDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the node holds %d dowse.dev resources and %d CDI devices", len(devices.allocatable), len(devices.cdi))

	// same checks that the Instances, Devices and broker Pods of before are
	// the same objects, the broker Pods still hold their device, the node
	// still offers it, the CRDs are this chart's and the stored objects read
	// back, and the counter ends in Device.status on its last value, after
	// what (the helm command r). The rolling update replaced both
	// controller replicas: the node's session moved from the replica that
	// held it before r to one of the new ones, and (the counter checks
	// below) no report was lost on the way.
	same := func(what string, r roll) {
		t.Helper()
		begin, took := r.begin, r.took
		waitReady(t, ctx, cl, "dowse-system", parts)
		holder := sessionServedBy(t, ctx, cl, func(pods []corev1.Pod) error {
			for _, p := range pods {
				if slices.Contains(r.replicas, p.Name) {
					return fmt.Errorf("%s: the replica %s of before still runs (before: %v)", what, p.Name, r.replicas)
				}
			}
			return nil
		})
		t.Logf("%s: the node's session was held by %s before (replicas %v), is held by %s after; holders while it rolled: %s",
			what, r.holder, r.replicas, holder.Name, sessions.since(r.holder, begin))
		for _, err := range diffSnapshots(before, uids(t, ctx, cl), what) {
			t.Error(err)
		}
		sameBrokers(t, brokers, brokerPods(t, ctx, cl, echo.Name, brokerPort), what)
		sameNodeDevices(t, ctx, cl, c.CDIDir, devices, what)
		crdsServed(t, ctx, cl, filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse"), what)
		// Device.status has caught up (Device.status holds the latest
		// values: a busy Device's are written at most once a second).
		figures(what, took, begin)
		counterCaughtUp(t, ctx, counter, plc, what)
		if errs := counter.errors(); len(errs) > 0 {
			t.Errorf("%s: Device.status showed the counter going back %d times, first: %v", what, len(errs), errs[:min(5, len(errs))])
		}
	}

	// The upgrade, under traffic: CRDs up to date, nothing lost, the twin
	// still moves.
	crdBefore := &apiextensionsv1.CustomResourceDefinition{}
	if err := cl.Get(ctx, client.ObjectKey{Name: "devices.dowse.dev"}, crdBefore); err != nil {
		t.Fatal(err)
	}
	if hasStateReport(crdBefore) {
		t.Fatalf("the earlier release's Device CRD already has spec.stateReport: pick an earlier commit, or check another CRD change")
	}
	r := rolling("latest", dev, "30", "upgrade", "dowse", filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse"), "--namespace", "dowse-system", "--values", valuesFile, "--wait", "--timeout", "4m")
	same("after the upgrade", r)
	waitTwin(t, ctx, cl, "setpoint", "30")
	t.Log("after the upgrade the same Instances, Devices, broker Pods (holding their device) and mapper Pods; no counter lost; the setpoint set while the release rolled (30) applied")

	// A field the earlier release does not know, set now: the
	// Configuration's device template asks for state reports every 2 s,
	// and the controller puts it in the Device's spec.
	if err := cl.Patch(ctx, modbus, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"deviceTemplate":{"stateReport":{"reportCycle":"2s"}}}}`))); err != nil {
		t.Fatal(err)
	}
	waitStateReport(t, ctx, cl, &v1alpha1.Device{ObjectMeta: dev.ObjectMeta}, "the Device after the upgrade")

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
	// Both replicas': the leader's and the session holder's metrics.
	served := promtest.Families(t, fmt.Sprintf("http://%s/metrics", net.JoinHostPort(agentPod(t, ctx, cl).Status.PodIP, strconv.Itoa(agentMetricsPort))))
	for _, p := range runningControllers(t, ctx, cl) {
		for k := range promtest.Families(t, fmt.Sprintf("http://%s/metrics", net.JoinHostPort(p.Status.PodIP, strconv.Itoa(controllerMetricsPort)))) {
			served[k] = true
		}
	}
	chart := filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse")
	for _, m := range promtest.QueriedMetrics(t, filepath.Join(chart, "files", "dashboard.json"), filepath.Join(chart, "files", "rules.yaml")) {
		if !served[m] {
			t.Errorf("the dashboard or the alerts query %s, which neither the agent nor the controller serves", m)
		}
	}

	// The rollback to the earlier release, under traffic: its images back,
	// the CRDs as this chart left them (a rollback runs no hook, and the
	// earlier binaries read the newer schema), nothing lost.
	r = rolling(earlierTag, dev, "25", "rollback", "dowse", "1", "--namespace", "dowse-system", "--wait", "--timeout", "4m")
	same("after the rollback", r)
	waitTwin(t, ctx, cl, "setpoint", "25")
	// The earlier controller reads the Configuration without the new
	// field; the Configuration, the user's, keeps it (nothing the earlier
	// release writes touches its spec), and the upgrade after brings it
	// to the Device if the earlier controller's apply dropped it.
	waitStateReport(t, ctx, cl, &v1alpha1.Configuration{ObjectMeta: modbus.ObjectMeta}, "the Configuration after the rollback")
	var rolled v1alpha1.Device
	if err := cl.Get(ctx, client.ObjectKeyFromObject(dev), &rolled); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the rollback the Device's spec.stateReport is %+v", rolled.Spec.StateReport)
	t.Log("after the rollback the same Instances, Devices, broker Pods (holding their device) and mapper Pods; no counter lost; the setpoint set while the release rolled (25) applied")

	// Forward again, so that the uninstall below is this chart's.
	r = rolling("latest", dev, "27", "upgrade", "dowse", chart, "--namespace", "dowse-system", "--values", valuesFile, "--wait", "--timeout", "4m")
	same("after the upgrade that follows the rollback", r)
	waitTwin(t, ctx, cl, "setpoint", "27")
	waitStateReport(t, ctx, cl, &v1alpha1.Device{ObjectMeta: dev.ObjectMeta}, "the Device after the upgrade that follows the rollback")

	// helm uninstall with everything in place.
	start := time.Now()
	helm("uninstall", "dowse", "--namespace", "dowse-system", "--wait", "--timeout", "3m")
	waitUninstalled(t, ctx, c.Config, "dowse-system")
	t.Logf("uninstalled, nothing left, in %v", time.Since(start).Round(100*time.Millisecond))

	sessions.stop()

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
// The broker's and the mapper's images are tagged o.tag (empty: latest);
// with o.counter the model and the device template have the PLC's counter
// (counterProperty), pushed to o.counterSink too when it is set.
func applyWorkloads(t *testing.T, ctx context.Context, cl client.Client, plc string, o workloadOptions) (*v1alpha1.Configuration, *v1alpha1.Configuration) {
	tag := o.tag
	if tag == "" {
		tag = "latest"
	}
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
	bc.Image = strings.TrimSuffix(bc.Image, ":latest") + ":" + tag
	if o.podNetwork {
		echo.Spec.BrokerSpec.BrokerPodSpec.HostNetwork = false
	}
	if err := cl.Create(ctx, echo); err != nil {
		t.Fatal(err)
	}
	closed, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// The unanswering target on the PLC's host.
	plcHost, _, err := net.SplitHostPort(plc)
	if err != nil {
		t.Fatal(err)
	}
	modbus := applyModbus(t, ctx, cl, []string{plc, net.JoinHostPort(plcHost, strconv.Itoa(closed))}, func(m *v1alpha1.DeviceModel, c *v1alpha1.Configuration) {
		if o.podNetwork {
			c.Spec.DeviceTemplate.MapperPodSpec.HostNetwork = false
		}
		if o.counter {
			counterProperty(m, c)
			if o.counterSink != nil {
				props := c.Spec.DeviceTemplate.Properties
				props[len(props)-1].PushMethod = o.counterSink
			}
		}
		mc := &c.Spec.DeviceTemplate.MapperPodSpec.Containers[0]
		mc.Image = strings.TrimSuffix(mc.Image, ":latest") + ":" + tag
	})
	waitInstances(t, ctx, cl, echo.Name, 1)
	return echo, modbus
}

type workloadOptions struct {
	tag     string
	counter bool
	// counterSink (with counter) is where the mapper also pushes each
	// counter reading.
	counterSink *v1alpha1.PushMethod
	// podNetwork puts the broker and the mapper Pods on the pod network
	// (a cluster with Options.PodNetwork), not on the node's.
	podNetwork bool
}

// applyModbus applies the Modbus sample with its model, scanning targets,
// its mapper Pod changed by mapperPod (nil: as the sample has it) after
// its metrics port is set and its image never pulled, and the model and
// the Configuration changed by change (nil: none).
func applyModbus(t *testing.T, ctx context.Context, cl client.Client, targets []string, change func(*v1alpha1.DeviceModel, *v1alpha1.Configuration)) *v1alpha1.Configuration {
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
	if change != nil {
		change(&model, modbus)
	}
	if err := cl.Create(ctx, &model); err != nil {
		t.Fatal(err)
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
		if rep, _ := dev.Twin(prop).Values(); rep == value {
			return nil
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

// diffSnapshots says which Instance, Device, broker Pod or mapper Pod of
// before is gone or another object (another UID) in after.
func diffSnapshots(before, after snapshot, what string) []error {
	var errs []error
	for kind, m := range map[string][2]map[string]types.UID{"Instance": {before.instances, after.instances}, "Device": {before.devices, after.devices}, "broker Pod": {before.pods, after.pods}} {
		for n, uid := range m[0] {
			if m[1][n] != uid {
				errs = append(errs, fmt.Errorf("%s: %s %s was %s and is %q", what, kind, n, uid, m[1][n]))
			}
		}
	}
	for n, uid := range before.mappers {
		switch now, ok := after.mappers[n]; {
		case !ok:
			errs = append(errs, fmt.Errorf("%s: the mapper Pod of %s is gone", what, n))
		case now != uid:
			errs = append(errs, fmt.Errorf("%s: the mapper Pod of %s was remade (%s, was %s)", what, n, now, uid))
		}
	}
	return errs
}

// hasStateReport says whether the Device CRD's schema has spec.stateReport.
func hasStateReport(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, v := range crd.Spec.Versions {
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		if _, ok := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties["stateReport"]; ok {
			return true
		}
	}
	return false
}

// waitStateReport waits until obj (a Device or a Configuration, read
// again) has the state report cycle the test set (2s) in its spec.
func waitStateReport(t *testing.T, ctx context.Context, cl client.Client, obj client.Object, what string) {
	t.Helper()
	eventuallyNode(t, ctx, time.Minute, func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		var sr *v1alpha1.StateReport
		switch o := obj.(type) {
		case *v1alpha1.Device:
			sr = o.Spec.StateReport
		case *v1alpha1.Configuration:
			sr = o.Spec.DeviceTemplate.StateReport
		}
		if sr == nil || sr.ReportCycle == nil || sr.ReportCycle.String() != "2s" {
			return fmt.Errorf("%s: spec.stateReport %+v, want reportCycle 2s", what, sr)
		}
		return nil
	})
}

// agentTagged fails unless the agent DaemonSet runs the image tagged tag.
func agentTagged(t *testing.T, ctx context.Context, cl client.Client, tag string) {
	t.Helper()
	var ds appsv1.DaemonSet
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "dowse-system", Name: "dowse-agent"}, &ds); err != nil {
		t.Fatal(err)
	}
	if img := ds.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(img, ":"+tag) {
		t.Fatalf("the agent runs %s, want the tag %s", img, tag)
	}
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

// The chart's default metrics ports of the agent and the controller, on
// each Pod's own address of the pod network.
const (
	agentMetricsPort      = 9743
	controllerMetricsPort = 9745
)

// podNetworkValues writes the values of a release on the test node with a
// pod network (cluster.Options.PodNetwork) at the chart's defaults (two
// controller replicas with leader election, ports, probes, no host
// network): the link on, its Service at a fixed address of the Service
// range (no cluster DNS runs here), the agent's state, CDI specs and the
// kubelet's pod-resources socket inside the cluster's directory, with
// extra merged in.
func podNetworkValues(t *testing.T, c *cluster.Cluster, extra map[string]any) string {
	t.Helper()
	linkIP := c.PodNetwork.ServiceAddress(77)
	values := map[string]any{
		"image":           map[string]any{"tag": "latest", "pullPolicy": "Never"},
		"stateDir":        filepath.Join(c.StateDir, "dowse"),
		"cdiSpecDir":      c.CDIDir,
		"podResourcesDir": filepath.Join(c.StateDir, "kubelet", "pod-resources"),
		"controller":      map[string]any{"nodeGracePeriod": "20s"},
		"link":            map[string]any{"enabled": true, "hosts": []string{linkIP}, "service": map[string]any{"clusterIP": linkIP}},
	}
	for k, v := range extra {
		values[k] = v
	}
	raw, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// roll is a helm command run under traffic: when it began, how long it
// took, and which replica held the node's session and which controller
// replicas ran before it.
type roll struct {
	begin    time.Time
	took     time.Duration
	holder   string
	replicas []string
}

// sessionServed waits until the chart's two controller replicas run on the
// pod network, one of them holds the node's session (its ownership record,
// named ready by the dowse-cloudhub Service), counts the node connected,
// and the agent counts itself connected; it returns the holder's Pod.
func sessionServed(t *testing.T, ctx context.Context, cl client.Client) corev1.Pod {
	t.Helper()
	return sessionServedBy(t, ctx, cl, func([]corev1.Pod) error { return nil })
}

// sessionServedBy is sessionServed with check passing for the running
// controller Pods too.
func sessionServedBy(t *testing.T, ctx context.Context, cl client.Client, check func([]corev1.Pod) error) corev1.Pod {
	t.Helper()
	var holder corev1.Pod
	name := waitHolder(t, ctx, cl, "", func(pods []corev1.Pod) error {
		if len(pods) != 2 {
			return fmt.Errorf("%d controller pods running, want the chart's 2", len(pods))
		}
		for _, p := range pods {
			if p.Spec.HostNetwork || p.Status.PodIP == "" {
				return fmt.Errorf("controller pod %s is not on the pod network (host network %v, address %q)", p.Name, p.Spec.HostNetwork, p.Status.PodIP)
			}
		}
		return check(pods)
	})
	for _, p := range runningControllers(t, ctx, cl) {
		if p.Name == name {
			holder = p
		}
	}
	if holder.Name != name {
		t.Fatalf("the holder %s of the node's session no longer runs", name)
	}
	waitMetricAt(t, ctx, net.JoinHostPort(holder.Status.PodIP, strconv.Itoa(controllerMetricsPort)), "dowse_cloudhub_connected_nodes 1")
	waitMetricAt(t, ctx, net.JoinHostPort(agentPod(t, ctx, cl).Status.PodIP, strconv.Itoa(agentMetricsPort)), "dowse_edgehub_connected 1")
	return holder
}

// runningControllers are the controller Pods running and not being deleted.
func runningControllers(t *testing.T, ctx context.Context, cl client.Client) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace("dowse-system"), client.MatchingLabels{"app.kubernetes.io/name": "dowse-controller"}); err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out = append(out, p)
		}
	}
	return out
}

// controllerPods are the names of the controller Pods that exist.
func controllerPods(t *testing.T, ctx context.Context, cl client.Client) []string {
	t.Helper()
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace("dowse-system"), client.MatchingLabels{"app.kubernetes.io/name": "dowse-controller"}); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// sessionTrack follows which controller replica holds the node's session
// (holderNow, polled every 200 ms; "" while none does) and keeps each
// change with when it was seen.
type sessionTrack struct {
	mu      sync.Mutex
	changes []sessionChange
	cancel  context.CancelFunc
	done    chan struct{}
}

type sessionChange struct {
	at     time.Time
	holder string
}

func trackSessions(t *testing.T, cl client.Client) *sessionTrack {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sessionTrack{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			h, _ := holderNow(ctx, cl, "", func([]corev1.Pod) error { return nil })
			s.mu.Lock()
			if n := len(s.changes); n == 0 || s.changes[n-1].holder != h {
				s.changes = append(s.changes, sessionChange{time.Now(), h})
			}
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(s.stop)
	return s
}

func (s *sessionTrack) stop() {
	s.cancel()
	<-s.done
}

// since says which replica held the node's session from begin on (first
// holder, the one seen before begin), each with when it was first seen.
func (s *sessionTrack) since(first string, begin time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []string{first}
	for _, c := range s.changes {
		if c.at.Before(begin) {
			continue
		}
		h := c.holder
		if h == "" {
			h = "none"
		}
		out = append(out, fmt.Sprintf("%s +%v", h, c.at.Sub(begin).Round(100*time.Millisecond)))
	}
	return strings.Join(out, " → ")
}
