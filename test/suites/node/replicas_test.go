package node

import (
	"context"
	"fmt"
	"net"
	"net/netip"
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

	"github.com/dowse-dev/dowse/internal/controller/link/ownership"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/modbusplc"
)

// TestChartReplicasOnNode installs the chart at its defaults (two
// controller replicas with leader election, no host network) with the link
// on, on a real node with a real pod network (test/framework/cluster's PodNetwork:
// a bridge, kube-proxy, the Services' addresses) and runs a twin through
// it: the Modbus sample finds a controller the test serves where the pod
// network reaches the machine, its Device is served by the controller-run
// mapper Pod (its host network turned off), and the agent reaches the
// replicas through the dowse-cloudhub Service. The replica that serves the
// agent holds the node's ownership record and is named ready by the
// Service's EndpointSlice. When that replica's Pod is deleted the other
// one takes the agent's session (a new holder of the record, the agent
// told its device membership again) and the twin goes on both ways: a
// desired value set after the move reaches the controller's register and
// comes back reported, and the Device's stored position of its reports
// never went back. `helm uninstall` then leaves nothing of the release
// (waitUninstalled).
func TestChartReplicasOnNode(t *testing.T) {
	kube.RequireHelm(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := startClusterWith(t, ctx, cluster.Options{PodNetwork: true},
		[2]string{"./agent/cmd/dowse-agent", "ghcr.io/dowse-dev/dowse-agent:latest"},
		[2]string{"./controller/cmd/dowse-controller", "ghcr.io/dowse-dev/dowse-controller:latest"},
		[2]string{"./discovery-handlers/modbus/cmd/dowse-modbus-discovery", "ghcr.io/dowse-dev/dowse-modbus-discovery:latest"},
		[2]string{"./mappers/modbus/cmd/dowse-modbus-mapper", "ghcr.io/dowse-dev/dowse-modbus-mapper:latest"})
	cl := newClient(t, c)
	// No cluster DNS runs here: the agents dial the Service at an address
	// fixed in the Service range.
	linkIP := c.PodNetwork.ServiceAddress(77)
	values := map[string]any{
		"image":           map[string]any{"tag": "latest", "pullPolicy": "Never"},
		"stateDir":        filepath.Join(c.StateDir, "dowse"),
		"cdiSpecDir":      c.CDIDir,
		"podResourcesDir": filepath.Join(c.StateDir, "kubelet", "pod-resources"),
		// The chart's own replicas (2), leader election, ports and probes.
		"link":   map[string]any{"enabled": true, "hosts": []string{linkIP}, "service": map[string]any{"clusterIP": linkIP}},
		"modbus": map[string]any{"discovery": map[string]any{"enabled": true}},
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
		if out, err := kube.HelmCommand(ctx, t, append(args, "--kubeconfig", c.Kubeconfig)...).CombinedOutput(); err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	helm("install", "dowse", filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse"),
		"--namespace", "dowse-system", "--create-namespace", "--values", valuesFile)

	podCIDR := netip.MustParsePrefix(c.PodNetwork.PodCIDR)
	onPodNetwork := func(p corev1.Pod) error {
		if ip, err := netip.ParseAddr(p.Status.PodIP); err != nil || !podCIDR.Contains(ip) {
			return fmt.Errorf("pod %s has address %q, not one of the pod network's %s", p.Name, p.Status.PodIP, podCIDR)
		}
		return nil
	}
	holder := waitHolder(t, ctx, cl, "", func(pods []corev1.Pod) error {
		if len(pods) != 2 {
			return fmt.Errorf("%d controller pods running, want the chart's 2", len(pods))
		}
		// Each replica on its own address of the pod network, both
		// listening on the link's port.
		for _, p := range pods {
			if err := onPodNetwork(p); err != nil {
				return err
			}
		}
		return nil
	})
	t.Logf("the agent's session is on %s", holder)
	agent := agentPod(t, ctx, cl)
	if err := onPodNetwork(agent); err != nil {
		t.Fatal(err)
	}
	agentMetrics := net.JoinHostPort(agent.Status.PodIP, "9743")
	waitMetricAt(t, ctx, agentMetrics, "dowse_edgehub_connected 1")

	writes := make(chan int16, 16)
	plc, err := modbusplc.StartOn(c.PodNetwork.HostIP, func(v int16) {
		select {
		case writes <- v:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer plc.Stop()
	// This node has a pod network: the mapper Pod as the sample has it,
	// not on the node's network as loadSample puts it.
	applyModbus(t, ctx, cl, []string{plc.Addr}, func(_ *v1alpha1.DeviceModel, c *v1alpha1.Configuration) {
		c.Spec.DeviceTemplate.MapperPodSpec.HostNetwork = false
	})
	// The sample's Device wants setpoint 21 (the controller starts at 18).
	dev := waitTwin(t, ctx, cl, "setpoint", "21")
	before := dev.Status.ReportedPosition
	if before == nil {
		t.Fatalf("the Device reports without a stored position: %+v", dev.Status)
	}
	t.Logf("the twin works through %s: setpoint 21 reported at position %+v", holder, *before)

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
	waitMetricAt(t, ctx, agentMetrics, "dowse_edgehub_connected 1")
	for n := 0; n < 2; {
		logs, err := c.Client.CoreV1().Pods("dowse-system").GetLogs(agent.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n = strings.Count(string(logs), "device membership from the cloud"); n < 2 && ctx.Err() != nil {
			t.Fatalf("the agent joined the link %d times, want 2 (the first holder's and the next one's):\n%s", n, logs)
		}
		time.Sleep(300 * time.Millisecond)
	}

	// The twin after the move: down to the register, back up as reported.
	setDesired(t, ctx, cl, dev, "setpoint", "30")
	waitWrite(t, ctx, writes, 30)
	dev = waitTwin(t, ctx, cl, "setpoint", "30")
	after := dev.Status.ReportedPosition
	if after == nil || after.Epoch <= before.Epoch {
		t.Fatalf("the Device's reports after the move are stored at %+v, before it at %+v: want the new session's greater epoch", after, *before)
	}
	t.Logf("setpoint 30 written and reported through %s, at position %+v", next, *after)

	// Nothing of the release is left (but the link CA it keeps on
	// purpose), found by asking the API server for every kind it serves.
	helm("uninstall", "dowse", "--namespace", "dowse-system", "--wait", "--timeout", "2m")
	waitUninstalled(t, ctx, c.Config, "dowse-system")
}

// agentPod is the one agent Pod, running with its address.
func agentPod(t *testing.T, ctx context.Context, cl client.Client) corev1.Pod {
	t.Helper()
	var agents corev1.PodList
	eventuallyNode(t, ctx, time.Minute, func() error {
		if err := cl.List(ctx, &agents, client.InNamespace("dowse-system"), client.MatchingLabels{"app.kubernetes.io/name": "dowse-agent"}); err != nil {
			return err
		}
		if len(agents.Items) != 1 || agents.Items[0].Status.PodIP == "" {
			return fmt.Errorf("agent pods %v", agents.Items)
		}
		return nil
	})
	return agents.Items[0]
}

// waitWrite waits until the controller's setpoint register is written v.
func waitWrite(t *testing.T, ctx context.Context, writes <-chan int16, v int16) {
	t.Helper()
	var seen []int16
	for {
		select {
		case w := <-writes:
			if w == v {
				return
			}
			seen = append(seen, w)
		case <-ctx.Done():
			t.Fatalf("the setpoint register was never written %d (written: %v)", v, seen)
		}
	}
}

// waitHolder waits until the node's ownership record is held by a running
// controller Pod other than old, the dowse-cloudhub Service's
// EndpointSlices name that Pod as ready, and check passes for the running
// controller Pods; it returns the holder's name.
func waitHolder(t *testing.T, ctx context.Context, cl client.Client, old string, check func([]corev1.Pod) error) string {
	t.Helper()
	var name string
	testwait.For(t, 2*time.Minute, func() error {
		if err := ctx.Err(); err != nil {
			t.Fatalf("%v while waiting for a replica to hold the node's session", err)
		}
		var err error
		if name, err = holderNow(ctx, cl, old, check); err != nil {
			return fmt.Errorf("no running replica holds the node's session: %w", err)
		}
		return nil
	})
	return name
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
