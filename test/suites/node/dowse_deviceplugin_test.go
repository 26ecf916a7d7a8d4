package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	debugecho "github.com/dowse-dev/dowse/discovery-handlers/debug-echo"
	"github.com/dowse-dev/dowse/internal/agent/deviceplugin"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/promtest"
)

// TestDowseDevicePlugins runs the agent and the debug-echo handler in this
// process against a real kubelet and containerd: pods that ask for
// dowse.dev/<instance> or dowse.dev/<configuration> get the device's
// environment through CDI, and no more pods than the capacity run at once.
func TestDowseDevicePlugins(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := startCluster(t, ctx)

	d := startDowse(t, ctx, c)
	cl := d.cl
	// A spec left by an Instance deleted while no agent ran: the agent
	// removes it when it starts.
	stale := filepath.Join(c.CDIDir, "dowse.dev_default_gone-0000.json")
	if err := os.WriteFile(stale, []byte(`{"cdiVersion":"0.6.0","kind":"dowse.dev/gone","devices":[{"name":"0000","containerEdits":{"env":["A=b"]}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	d.startAgent(false)

	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"}}
	cfg.Spec.DiscoveryHandler.Name = debugecho.DefaultName
	cfg.Spec.DiscoveryHandler.DiscoveryDetails = &apiextensionsv1.JSON{Raw: []byte(`{"descriptions":["foo0"]}`)}
	cfg.Spec.Capacity = 2
	if err := cl.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	// The Instance appears, then its resource in the node's allocatable.
	var inst v1alpha1.Instance
	for {
		var l v1alpha1.InstanceList
		if err := cl.List(ctx, &l, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		if len(l.Items) > 0 {
			inst = l.Items[0]
			break
		}
		if ctx.Err() != nil {
			t.Fatal("no Instance")
		}
		time.Sleep(20 * time.Millisecond)
	}
	seen := time.Now()
	instRes := corev1.ResourceName(inst.ResourceName())
	cfgRes := corev1.ResourceName(v1alpha1.ResourceName(cfg.Namespace, cfg.Name))
	// allocatableIs waits until the node offers exactly want of each
	// resource (within limit).
	allocatableIs := func(limit time.Duration, want map[corev1.ResourceName]int64) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ok := true
			for res, v := range want {
				q := n.Status.Allocatable[res]
				ok = ok && q.Value() == v
			}
			if ok {
				return
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				t.Fatalf("node allocatable %v, want %v", n.Status.Allocatable, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitAllocatable := func() { t.Helper(); allocatableIs(time.Minute, map[corev1.ResourceName]int64{instRes: 2, cfgRes: 2}) }
	waitAllocatable()
	t.Logf("Instance %s seen to both resources allocatable: %s (Instance created %s before it was seen)",
		inst.Name, time.Since(seen).Round(time.Millisecond), seen.Sub(inst.CreationTimestamp.Time).Round(time.Second))
	if _, err := os.Stat(filepath.Join(c.CDIDir, inst.CDISpecFileName()+".json")); err != nil {
		t.Fatalf("no CDI spec: %v", err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale CDI spec not removed: %v", err)
	}

	hashEnv := "DEBUG_ECHO_DESCRIPTION_" + v1alpha1.EnvName(v1alpha1.InstanceHash(inst.Name))
	pods := c.Client.CoreV1().Pods("default")
	devicePod := func(name string, res corev1.ResourceName) {
		t.Helper()
		p := probePod(name, "env:DEBUG_ECHO_DESCRIPTION", "env:"+hashEnv, "echo:probed", "sleep:10m")
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{res: resource.MustParse("1")}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	expectEnv := func(name string) {
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
		for _, want := range []string{"env DEBUG_ECHO_DESCRIPTION=foo0", "env " + hashEnv + "=foo0"} {
			if !strings.Contains(logs, want) {
				t.Errorf("pod %s logs lack %q:\n%s", name, want, logs)
			}
		}
	}
	deletePod := func(name string) {
		t.Helper()
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		waitGone(t, ctx, "pod "+name, func() error { _, err := pods.Get(ctx, name, metav1.GetOptions{}); return err })
	}

	t.Run("InstanceResource", func(t *testing.T) {
		devicePod("inst-1", instRes)
		devicePod("inst-2", instRes)
		expectEnv("inst-1")
		expectEnv("inst-2")
	})
	t.Run("BeyondCapacityPending", func(t *testing.T) {
		devicePod("inst-3", instRes)
		time.Sleep(3 * time.Second)
		p, err := pods.Get(ctx, "inst-3", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodPending {
			t.Fatalf("third pod is %s, want Pending", p.Status.Phase)
		}
		// Freeing a slot lets it run.
		deletePod("inst-1")
		expectEnv("inst-3")
	})
	t.Run("NoDoubleBookingAcrossResources", func(t *testing.T) {
		// Both slots are held through the Instance's resource: the
		// Configuration's resource offers none of them.
		allocatableIs(time.Minute, map[corev1.ResourceName]int64{cfgRes: 0})
		devicePod("cfg-0", cfgRes)
		time.Sleep(3 * time.Second)
		p, err := pods.Get(ctx, "cfg-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodPending {
			t.Fatalf("pod for %s is %s, want Pending", cfgRes, p.Status.Phase)
		}
	})
	t.Run("SlotsClaimed", func(t *testing.T) {
		var cur v1alpha1.Instance
		if err := cl.Get(ctx, client.ObjectKeyFromObject(&inst), &cur); err != nil {
			t.Fatal(err)
		}
		if len(cur.Status.Slots) == 0 {
			t.Fatal("no slot claimed in status")
		}
		for _, s := range cur.Status.Slots {
			if s.Node != c.NodeName {
				t.Errorf("slot %+v held by another node", s)
			}
		}
		t.Logf("slots: %+v", cur.Status.Slots)
	})
	t.Run("ConfigurationResource", func(t *testing.T) {
		// Freed (after the reclaimer's grace), the slots serve the pending
		// pod that asked for any device of the Configuration.
		deletePod("inst-2")
		deletePod("inst-3")
		begin := time.Now()
		expectEnv("cfg-0")
		t.Logf("pending Configuration pod ran %s after the Instance pods were deleted", time.Since(begin).Round(100*time.Millisecond))
		deletePod("cfg-0")
	})
	t.Run("ClassicAfterAgentRestart", func(t *testing.T) {
		var before v1alpha1.Instance
		if err := cl.Get(ctx, client.ObjectKeyFromObject(&inst), &before); err != nil {
			t.Fatal(err)
		}
		d.stopAgent()
		// The kubelet notices the plugins gone (their devices unhealthy)
		// before the new agent starts, so that the wait below sees the new
		// agent's plugins, not the old figures.
		allocatableIs(time.Minute, map[corev1.ResourceName]int64{instRes: 0})
		// A classic answer names no CDI device, so the env the pod sees
		// can only come from Allocate's response.
		d.startAgent(true)
		begin := time.Now()
		waitAllocatable()
		t.Logf("agent restarted; resources allocatable after %s", time.Since(begin).Round(time.Millisecond))
		devicePod("classic-1", instRes)
		expectEnv("classic-1")
		var after v1alpha1.Instance
		if err := cl.Get(ctx, client.ObjectKeyFromObject(&inst), &after); err != nil {
			t.Fatal(err)
		}
		// The reclaimer may have freed unused slots meanwhile; none is
		// doubled and the running pod's is held.
		ids := map[string]bool{}
		for _, s := range after.Status.Slots {
			if ids[s.ID] || s.Node != c.NodeName {
				t.Fatalf("slots before restart %+v, after %+v", before.Status.Slots, after.Status.Slots)
			}
			ids[s.ID] = true
		}
		if len(ids) == 0 || len(ids) > 2 {
			t.Fatalf("slots before restart %+v, after %+v", before.Status.Slots, after.Status.Slots)
		}
		deletePod("classic-1")
	})
	t.Run("Reclaim", func(t *testing.T) {
		// Every pod is gone: the reclaimer frees every slot within the
		// grace period (2s) plus a scan (1s).
		begin := time.Now()
		for {
			var cur v1alpha1.Instance
			if err := cl.Get(ctx, client.ObjectKeyFromObject(&inst), &cur); err != nil {
				t.Fatal(err)
			}
			if len(cur.Status.Slots) == 0 {
				break
			}
			if time.Since(begin) > 10*time.Second {
				t.Fatalf("slots still held: %+v", cur.Status.Slots)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("all slots freed %s after the last pod was deleted", time.Since(begin).Round(100*time.Millisecond))
	})
	t.Run("TwoNamespacesOneDevice", func(t *testing.T) {
		// Another namespace's Configuration of the same name sees the same
		// device: its Instance has the same name. Before names carried the
		// namespace both had one resource and one CDI device, which the
		// CDI library resolves to nothing when two specs define it.
		const other = "team-b"
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Client.CoreV1().ServiceAccounts(other).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		b := cfg.DeepCopy()
		b.ObjectMeta = metav1.ObjectMeta{Name: cfg.Name, Namespace: other}
		b.Spec.Capacity = 1
		b.Spec.BrokerProperties = map[string]string{"TEAM": other}
		if err := cl.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
		otherInst := v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: inst.Name}}
		otherRes := corev1.ResourceName(otherInst.ResourceName())
		allocatableIs(time.Minute, map[corev1.ResourceName]int64{instRes: 2, otherRes: 1})
		run := func(ns, name string, res corev1.ResourceName) {
			t.Helper()
			p := probePod(name, "env:DEBUG_ECHO_DESCRIPTION", "env:TEAM", "echo:probed", "sleep:10m")
			p.Namespace = ns
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{res: resource.MustParse("1")}
			if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		logsOf := func(ns, name string) string {
			t.Helper()
			for ctx.Err() == nil {
				p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
					t.Fatalf("pod %s/%s: %+v", ns, name, p.Status)
				}
				for _, cs := range p.Status.ContainerStatuses {
					if w := cs.State.Waiting; w != nil && w.Reason == "CreateContainerError" {
						t.Fatalf("pod %s/%s: %s", ns, name, w.Message)
					}
				}
				if p.Status.Phase == corev1.PodRunning {
					b, err := c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
					if err == nil && strings.Contains(string(b), "probed") {
						return string(b)
					}
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Fatalf("pod %s/%s: no output", ns, name)
			return ""
		}
		run("default", "ns-a", instRes)
		run(other, "ns-b", otherRes)
		a, bl := logsOf("default", "ns-a"), logsOf(other, "ns-b")
		if !strings.Contains(a, "env DEBUG_ECHO_DESCRIPTION=foo0") || !strings.Contains(a, "env TEAM unset") {
			t.Errorf("default's pod got:\n%s", a)
		}
		if !strings.Contains(bl, "env DEBUG_ECHO_DESCRIPTION=foo0") || !strings.Contains(bl, "env TEAM="+other) {
			t.Errorf("%s's pod got:\n%s", other, bl)
		}
		for ns, name := range map[string]string{"default": "ns-a", other: "ns-b"} {
			if err := c.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
				t.Fatal(err)
			}
			waitGone(t, ctx, "pod "+name, func() error { _, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); return err })
		}
		if err := cl.Delete(ctx, b); err != nil {
			t.Fatal(err)
		}
		waitGone(t, ctx, "the other namespace's Instance", func() error { return cl.Get(ctx, client.ObjectKeyFromObject(&otherInst), &v1alpha1.Instance{}) })
		for begin := time.Now(); ; time.Sleep(50 * time.Millisecond) {
			m, _ := filepath.Glob(filepath.Join(deviceplugin.DefaultDir, "dowse-*.sock"))
			if len(m) == 2 {
				break
			}
			if time.Since(begin) > 30*time.Second {
				t.Fatalf("plugin sockets after the other namespace's Configuration went: %v", m)
			}
		}
	})
	t.Run("KubeletRestart", func(t *testing.T) {
		devicePod("steady", instRes)
		expectEnv("steady")
		before, err := pods.Get(ctx, "steady", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		regsBefore := promtest.Sum(t, d.reg, "dowse_agent_device_plugin_registrations_total", nil)
		begin := time.Now()
		if err := c.RestartKubelet(ctx); err != nil {
			t.Fatal(err)
		}
		sockUp := time.Since(begin)
		// Both plugins (Instance and Configuration) register with the new
		// kubelet, within a second of its socket appearing.
		for promtest.Sum(t, d.reg, "dowse_agent_device_plugin_registrations_total", nil) < regsBefore+2 {
			if time.Since(begin) > sockUp+10*time.Second {
				t.Fatalf("plugins did not register again: %v registrations before, %v now", regsBefore,
					promtest.Sum(t, d.reg, "dowse_agent_device_plugin_registrations_total", nil))
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("kubelet socket back after %s; both plugins registered again %s after the restart began",
			sockUp.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
		// The new kubelet allocates from them: a new pod gets the device.
		devicePod("after-restart", instRes)
		expectEnv("after-restart")
		// The pod that ran through the restart was not disturbed.
		after, err := pods.Get(ctx, "steady", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, a := before.Status.ContainerStatuses[0], after.Status.ContainerStatuses[0]
		if after.Status.Phase != corev1.PodRunning || a.ContainerID != b.ContainerID || a.RestartCount != 0 {
			t.Fatalf("pod across the kubelet restart: phase %s, container %s -> %s, restarts %d", after.Status.Phase, b.ContainerID, a.ContainerID, a.RestartCount)
		}
		deletePod("steady")
		deletePod("after-restart")
	})
	t.Run("OfflineRemovesPluginAndSpec", func(t *testing.T) {
		spec := filepath.Join(c.CDIDir, inst.CDISpecFileName()+".json")
		sockets := func() []string {
			m, _ := filepath.Glob(filepath.Join(deviceplugin.DefaultDir, "dowse-*.sock"))
			return m
		}
		if len(sockets()) != 2 {
			t.Fatalf("plugin sockets before OFFLINE: %v", sockets())
		}
		d.setAvailability(false)
		begin := time.Now()
		for {
			err := cl.Get(ctx, client.ObjectKeyFromObject(&inst), &v1alpha1.Instance{})
			_, specErr := os.Stat(spec)
			if apierrors.IsNotFound(err) && os.IsNotExist(specErr) && len(sockets()) == 0 {
				break
			}
			if time.Since(begin) > 30*time.Second {
				t.Fatalf("after OFFLINE: Instance get %v, spec %v, sockets %v", err, specErr, sockets())
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("OFFLINE: Instance, CDI spec and plugin sockets gone after %s", time.Since(begin).Round(time.Millisecond))
		allocatableIs(30*time.Second, map[corev1.ResourceName]int64{instRes: 0})
		// ONLINE brings the same Instance, spec and resources back.
		d.setAvailability(true)
		waitAllocatable()
		if _, err := os.Stat(spec); err != nil {
			t.Fatalf("CDI spec not back after ONLINE: %v", err)
		}
	})
}
