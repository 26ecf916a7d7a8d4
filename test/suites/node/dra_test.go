package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/controller"
	debugecho "github.com/dowse-dev/dowse/discovery-handlers/debug-echo"
	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/internal/slicewriter"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/promtest"
)

// startDRAAgent runs an agent with DRA on and device plugins off, its
// kubelet plugin registered with the cluster's kubelet, until d.stopAgent.
// It runs as startAgent's does: under its pod's token, with deploy/agent's
// RBAC and node admission policy (its slices are its node's).
func (d *dowseOnNode) startDRAAgent() {
	t := d.t
	actx, acancel := context.WithCancel(d.runCtx)
	done := make(chan error, 1)
	d.reg = prometheus.NewRegistry()
	reg := d.reg
	go func() {
		done <- agent.Run(actx, agent.Config{
			SkipNameValidation: true,
			RESTConfig:         rest.CopyConfig(d.agentConfig), NodeName: d.c.NodeName, StateDir: d.state,
			GracePeriod: time.Minute, WriteConcurrency: 4, Serving: kubeflags.Off(),
			Registerer: reg, CDISpecDir: d.c.CDIDir,
			DRA: agent.DRAConfig{
				Enabled: true,
				// The cluster's kubelet has a root directory of its own.
				RegistrarDir: filepath.Join(d.c.StateDir, "kubelet", "plugins_registry"),
				PluginDir:    filepath.Join(d.c.StateDir, "dra"),
			},
		}, testr.New(t).WithName("agent"))
	}()
	var stopped bool
	d.stopAgent = func() {
		if stopped {
			return
		}
		stopped = true
		acancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}
}

// TestDRAOnNode runs the controller, the agent (DRA on, device plugins
// off) and two debug-echo handlers (one local, one shared) in this process
// against a real kubelet, scheduler and controller manager: pods ask for
// devices through ResourceClaimTemplates selecting by CEL on an attribute.
func TestDRAOnNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, [2]string{"./brokers/debug-echo/cmd/dowse-debug-echo-broker", brokerImage})
	d := startDowse(t, ctx, c)
	cl := d.cl
	// A shared debug-echo handler beside the local one startDowse runs.
	sharedDone := make(chan error, 1)
	sctx, stopShared := context.WithCancel(d.runCtx)
	go func() {
		sharedDone <- debugecho.Run(sctx, debugecho.Config{Name: "echo-shared", Shared: true, StateDir: d.state,
			AvailabilityFile: filepath.Join(d.state, "shared-availability"), Logger: testr.New(t).WithName("echo-shared")})
	}()
	t.Cleanup(func() { stopShared(); <-sharedDone })
	cctx, stopController := context.WithCancel(d.runCtx)
	ctrlDone := make(chan error, 1)
	go func() {
		ctrlDone <- controller.Run(cctx, controller.Config{RESTConfig: c.Config, SkipNameValidation: true, NodeGracePeriod: time.Hour,
			Serving: kubeflags.Off(), Registerer: prometheus.NewRegistry(), DRA: true}, testr.New(t).WithName("controller"))
	}()
	t.Cleanup(func() {
		stopController()
		if err := <-ctrlDone; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	d.startDRAAgent()

	mkConfig := func(name, handler string) {
		t.Helper()
		cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
		cfg.Spec.DiscoveryHandler.Name = handler
		cfg.Spec.DiscoveryHandler.DiscoveryDetails = &apiextensionsv1.JSON{Raw: []byte(`{"descriptions":["foo1","foo2"]}`)}
		cfg.Spec.Capacity = 2
		cfg.Spec.Allocation = v1alpha1.AllocationDRA
		if err := cl.Create(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	mkConfig("echo", debugecho.DefaultName)
	mkConfig("echo-shared", "echo-shared")

	// Both Configurations' devices appear in slices: the local ones in the
	// agent's pool, the shared ones in the controller's, selecting this
	// node.
	waitDevices := func(want int) {
		t.Helper()
		for {
			var list resourceapi.ResourceSliceList
			if err := cl.List(ctx, &list); err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, s := range list.Items {
				if s.Spec.Driver == shareddra.DriverName {
					n += len(s.Spec.Devices)
				}
			}
			if n == want {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%d devices in slices, want %d", n, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitDevices(4)

	claims := c.Client.ResourceV1().ResourceClaimTemplates("default")
	pods := c.Client.CoreV1().Pods("default")
	template := func(name, cfg, cel string) {
		t.Helper()
		tmpl := &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "echo", Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: shareddra.DeviceClassName("default", cfg),
					Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}},
				}}},
			}}},
		}
		if _, err := claims.Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	byDescription := func(v string) string {
		return fmt.Sprintf(`device.attributes[%q].%s == %q`, shareddra.DriverName, debugecho.DescriptionProperty, v)
	}
	template("local-foo1", "echo", byDescription("foo1"))
	template("shared-foo2", "echo-shared", byDescription("foo2"))
	template("nothing", "echo", byDescription("no-such-description"))

	claimPod := func(name, tmpl string) {
		t.Helper()
		p := probePod(name, "env:"+debugecho.DescriptionProperty, "echo:probed", "sleep:10m")
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "dev", ResourceClaimTemplateName: &tmpl}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "dev"}}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	expectEnv := func(name, want string) {
		t.Helper()
		p := waitPodPhase(t, ctx, c.Client, name, corev1.PodRunning, corev1.PodFailed, corev1.PodSucceeded)
		if p.Status.Phase != corev1.PodRunning {
			t.Fatalf("pod %s: %+v", name, p.Status)
		}
		var logs string
		for ctx.Err() == nil {
			if logs = podLogs(t, ctx, c.Client, name); strings.Contains(logs, "probed") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if w := "env " + debugecho.DescriptionProperty + "=" + want; !strings.Contains(logs, w) {
			t.Errorf("pod %s logs lack %q:\n%s", name, w, logs)
		}
	}
	// expectPending checks that the pod stays unscheduled for a while, with
	// the scheduler's reason.
	expectPending := func(name string) {
		t.Helper()
		deadline := time.Now().Add(4 * time.Second)
		var reason string
		for time.Now().Before(deadline) {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
				t.Fatalf("pod %s is %s on %q, want Pending unscheduled", name, p.Status.Phase, p.Spec.NodeName)
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
					reason = cond.Reason + ": " + cond.Message
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		if reason == "" {
			t.Fatalf("pod %s has no PodScheduled=False condition", name)
		}
		t.Logf("pod %s pending: %s", name, reason)
	}
	deletePod := func(name string) {
		t.Helper()
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		waitGone(t, ctx, "pod "+name, func() error { _, err := pods.Get(ctx, name, metav1.GetOptions{}); return err })
	}
	prepared := func() float64 {
		return promtest.Sum(t, d.reg, "dowse_agent_dra_prepares_total", map[string]string{"result": "prepared"})
	}

	t.Run("LocalDeviceByAttribute", func(t *testing.T) {
		claimPod("local-1", "local-foo1")
		expectEnv("local-1", "foo1")
	})
	t.Run("SharedDeviceByAttribute", func(t *testing.T) {
		claimPod("shared-1", "shared-foo2")
		expectEnv("shared-1", "foo2")
	})
	t.Run("UnsatisfiableClaimPending", func(t *testing.T) {
		claimPod("nothing-1", "nothing")
		expectPending("nothing-1")
	})
	t.Run("CapacityTwoSharedThirdWaits", func(t *testing.T) {
		// local-1 holds one of foo1's two slots.
		claimPod("local-2", "local-foo1")
		expectEnv("local-2", "foo1")
		claimPod("local-3", "local-foo1")
		expectPending("local-3")
		deletePod("local-1")
		expectEnv("local-3", "foo1")
	})
	t.Run("AgentRestartKeepsPreparedClaims", func(t *testing.T) {
		before := prepared()
		d.stopAgent()
		d.startDRAAgent()
		// The restarted agent republishes (the same slices) and serves the
		// plugin again; running pods keep their devices, and a new claim
		// is prepared by it.
		claimPod("shared-2", "shared-foo2")
		expectEnv("shared-2", "foo2")
		for _, name := range []string{"local-2", "local-3", "shared-1"} {
			if p, err := pods.Get(ctx, name, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
				t.Fatalf("pod %s after the agent restart: %v %v", name, err, p.Status.Phase)
			}
		}
		t.Logf("prepares before the restart %v, by the new agent %v", before, prepared())
	})
	t.Run("KubeletRestartPreparesNothingTwice", func(t *testing.T) {
		before := prepared()
		if err := c.RestartKubelet(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		for _, name := range []string{"local-2", "local-3", "shared-1", "shared-2"} {
			if p, err := pods.Get(ctx, name, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
				t.Fatalf("pod %s after the kubelet restart: %v %v", name, err, p.Status.Phase)
			}
		}
		if after := prepared(); after != before {
			t.Errorf("claims prepared anew after the kubelet restart: %v -> %v", before, after)
		}
		t.Logf("prepare calls answered from the checkpoint: %v", promtest.Sum(t, d.reg, "dowse_agent_dra_prepares_total", map[string]string{"result": "again"}))
	})
	t.Run("OfflineDeviceLeavesSlice", func(t *testing.T) {
		// Free foo1's slots but one, so that only going OFFLINE keeps a
		// new claim out.
		deletePod("local-2")
		d.setAvailability(false)
		waitDevices(2) // the shared Configuration's two stay
		if p, err := pods.Get(ctx, "local-3", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
			t.Fatalf("running pod disturbed by OFFLINE: %v %v", err, p.Status.Phase)
		}
		// The plugin reports the device Unhealthy, and the kubelet shows
		// it in the pod's status.
		offline := time.Now()
		for {
			p, err := pods.Get(ctx, "local-3", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			health := ""
			for _, cs := range p.Status.ContainerStatuses {
				for _, rs := range cs.AllocatedResourcesStatus {
					for _, r := range rs.Resources {
						health = string(r.Health)
					}
				}
			}
			if health == string(corev1.ResourceHealthStatusUnhealthy) {
				t.Logf("local-3's device Unhealthy in its status %s after OFFLINE", time.Since(offline).Round(100*time.Millisecond))
				break
			}
			if time.Since(offline) > 45*time.Second {
				t.Fatalf("local-3's device health %q 45s after OFFLINE, want Unhealthy", health)
			}
			time.Sleep(500 * time.Millisecond)
		}
		claimPod("local-4", "local-foo1")
		expectPending("local-4")
		d.setAvailability(true)
		waitDevices(4)
		expectEnv("local-4", "foo1")
	})
	t.Run("ClaimToRunningLatency", func(t *testing.T) {
		for _, n := range []string{"local-3", "local-4", "shared-1", "shared-2", "nothing-1"} {
			deletePod(n)
		}
		var lat []time.Duration
		for i := range 10 {
			name := fmt.Sprintf("lat-%d", i)
			begin := time.Now()
			claimPod(name, "local-foo1")
			waitPodPhase(t, ctx, c.Client, name, corev1.PodRunning)
			lat = append(lat, time.Since(begin))
			deletePod(name)
		}
		slices.Sort(lat)
		t.Logf("claim created -> pod running, %d pods one at a time: p50 %s, p99 %s (max)", len(lat),
			lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	})
	t.Run("Samples", func(t *testing.T) {
		// samples/debug-echo-dra.yaml and the pod of samples/dra/ as they
		// are, but for the node's network (the test node has no pod
		// network) and a free port.
		if err := cl.Create(ctx, loadSample(t, "debug-echo-dra.yaml")); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(kube.RepoRoot(), "samples", "dra", "debug-echo-claim.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		docs := strings.Split(string(raw), "\n---\n")
		if len(docs) != 2 {
			t.Fatalf("%d documents", len(docs))
		}
		var tmpl resourceapi.ResourceClaimTemplate
		var pod corev1.Pod
		if err := yaml.UnmarshalStrict([]byte(docs[0]), &tmpl); err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict([]byte(docs[1]), &pod); err != nil {
			t.Fatal(err)
		}
		tmpl.Namespace, pod.Namespace = "default", "default"
		pod.Spec.HostNetwork = true
		pod.Spec.Containers[0].Args[0] = "--listen=127.0.0.1:0"
		if _, err := claims.Create(ctx, &tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := pods.Create(ctx, &pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitBrokerEnv(t, ctx, c, pod.Name, "foo1")

		// samples/debug-echo-broker-dra.yaml: the controller's broker Pod
		// gets its Instance's device through a claim.
		if err := cl.Create(ctx, loadSample(t, "debug-echo-broker-dra.yaml")); err != nil {
			t.Fatal(err)
		}
		insts := waitInstances(t, ctx, cl, "debug-echo-broker-dra", 1)
		brokerName := v1alpha1.BrokerPodName(insts[0].Name, c.NodeName)
		waitBrokerEnv(t, ctx, c, brokerName, "foo0")
		p, err := pods.Get(ctx, brokerName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Spec.ResourceClaims) != 1 || len(p.Status.ResourceClaimStatuses) != 1 {
			t.Fatalf("broker pod claims %+v, statuses %+v", p.Spec.ResourceClaims, p.Status.ResourceClaimStatuses)
		}
		deletePod(pod.Name)
		for _, name := range []string{"debug-echo-dra", "debug-echo-broker-dra"} {
			if err := cl.Delete(ctx, &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}); err != nil {
				t.Fatal(err)
			}
		}
		waitGone(t, ctx, "broker pod", func() error { _, err := pods.Get(ctx, brokerName, metav1.GetOptions{}); return err })
	})
	t.Run("OwnersTakeSlicesWithThem", func(t *testing.T) {
		// The owners slicewriter gives slices are ones the controller
		// manager's garbage collector follows: a Node's local slices go
		// with the Node, a shared pool's with its DeviceClass. A driver of
		// the test's own, so that Dowse's writers leave these alone.
		const driver = "gc-test.dowse.dev"
		meta, err := metadata.NewForConfig(c.Config)
		if err != nil {
			t.Fatal(err)
		}
		node, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dra-gone-node"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		class, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gc-test.dowse.dev"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		one := func() []slicewriter.Slice {
			return []slicewriter.Slice{{Digest: "d1", Devices: func() []resourceapi.Device { return []resourceapi.Device{{Name: "d1"}} }}}
		}
		var stops []func()
		stopWriters := func() {
			for _, stop := range stops {
				stop()
			}
		}
		defer stopWriters()
		for _, w := range []struct {
			opts slicewriter.Options
			pool string
			p    slicewriter.Pool
		}{
			{slicewriter.Options{Driver: driver, NodeName: node.Name, Owner: &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID, Controller: ptr.To(true)}},
				"dra-gone-node/gc", slicewriter.Pool{Slices: one()}},
			{slicewriter.Options{Driver: driver}, "shared/gc",
				slicewriter.Pool{Slices: one(), NodeSelector: shareddra.NodeSelector([]string{c.NodeName}),
					Owner: &metav1.OwnerReference{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass", Name: class.Name, UID: class.UID}}},
		} {
			sw, err := slicewriter.New(c.Client.ResourceV1().ResourceSlices(), meta, w.opts, testr.New(t).WithName("writer"))
			if err != nil {
				t.Fatal(err)
			}
			sw.Update(map[string]slicewriter.Pool{w.pool: w.p})
			stops = append(stops, sw.Go(ctx))
		}
		slicesOf := func() []string {
			list, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + driver})
			if err != nil {
				t.Fatal(err)
			}
			var pools []string
			for _, s := range list.Items {
				pools = append(pools, s.Spec.Pool.Name)
			}
			slices.Sort(pools)
			return pools
		}
		waitPools := func(want ...string) {
			t.Helper()
			for ctx.Err() == nil {
				if got := slicesOf(); slices.Equal(got, want) {
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Fatalf("pools %v, want %v", slicesOf(), want)
		}
		waitPools("dra-gone-node/gc", "shared/gc")
		// The writers stop first: they would write their slices again.
		stopWriters()
		if err := c.Client.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPools("shared/gc")
		if err := c.Client.ResourceV1().DeviceClasses().Delete(ctx, class.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPools()
	})
	t.Run("ConfigurationGoneTakesSlicesAndClass", func(t *testing.T) {
		for _, name := range []string{"echo", "echo-shared"} {
			if err := cl.Delete(ctx, &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}); err != nil {
				t.Fatal(err)
			}
		}
		waitDevices(0)
		for _, name := range []string{"echo", "echo-shared"} {
			waitGone(t, ctx, "class", func() error {
				return cl.Get(ctx, client.ObjectKey{Name: shareddra.DeviceClassName("default", name)}, &resourceapi.DeviceClass{})
			})
		}
	})
}

// waitBrokerEnv waits until the debug-echo broker in pod name runs and has
// logged the device description want, received through CDI.
func waitBrokerEnv(t *testing.T, ctx context.Context, c *cluster.Cluster, name, want string) {
	t.Helper()
	p := waitPodPhase(t, ctx, c.Client, name, corev1.PodRunning, corev1.PodFailed, corev1.PodSucceeded)
	if p.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod %s: %+v", name, p.Status)
	}
	var logs string
	for ctx.Err() == nil {
		logs = podLogs(t, ctx, c.Client, name)
		if strings.Contains(logs, debugecho.DescriptionProperty) && strings.Contains(logs, want) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("pod %s never logged %s %s:\n%s", name, debugecho.DescriptionProperty, want, logs)
}
