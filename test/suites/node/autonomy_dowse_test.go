package node

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goburrow/modbus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/promtest"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/modbusplc"
)

// TestDowseNodeRebootsOfflineAndServesItsDevices: the chart's agent and
// handlers on the real node with edge autonomy on (the node API proxy as a
// static pod, nodeAPI.enabled), the controller in the cloud (on the
// machine), broker Pods running and a Modbus twin served by its mapper.
// With a desired setpoint applied, the node is cut off from the machine
// (the PLC on its own network stays reachable) and rebooted. Still cut
// off, the agent, the handlers, the mapper and the brokers run again, the
// mapper writes the desired setpoint to the PLC again from what the agent
// kept, and its readings queue at the edge; once the network is back they
// reach the cloud, nothing dropped, and the Instances, Devices, broker and
// mapper Pods are the ones from before.
func TestDowseNodeRebootsOfflineAndServesItsDevices(t *testing.T) {
	kube.RequireHelm(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	const agentLatest = "ghcr.io/dowse-dev/dowse-agent:latest"
	c := startClusterWith(t, ctx, cluster.Options{PodNetwork: true, StaticPods: true},
		[2]string{"./agent/cmd/dowse-agent", agentLatest},
		[2]string{"./discovery-handlers/debug-echo/cmd/dowse-debug-echo-discovery", "ghcr.io/dowse-dev/dowse-debug-echo-discovery:latest"},
		[2]string{"./discovery-handlers/modbus/cmd/dowse-modbus-discovery", "ghcr.io/dowse-dev/dowse-modbus-discovery:latest"},
		[2]string{"./mappers/modbus/cmd/dowse-modbus-mapper", "ghcr.io/dowse-dev/dowse-modbus-mapper:latest"},
		[2]string{"./brokers/debug-echo/cmd/dowse-debug-echo-broker", "ghcr.io/dowse-dev/dowse-debug-echo-broker:latest"})
	cl := newClient(t, c)
	if err := kube.InstallCRDs(c.Config); err != nil {
		t.Fatal(err)
	}
	const ns = "dowse-system"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	host := c.PodNetwork.HostIP
	stateDir := filepath.Join(c.StateDir, "dowse")

	// The cloud: the controller on the machine, serving the link on the
	// machine's end of the node's network.
	dir := t.TempDir()
	cloud := startReplica(t, dir, c.Kubeconfig, host, "cloud", "--namespace", ns,
		"--link-agent-service-accounts", "dowse-agent", "--agent-service-accounts", ns+"/dowse-agent",
		"--mapper-state-dir", stateDir, "--mapper-socket-group", "2000", "--node-grace-period", "10m")
	var tok struct{ Token, CACertHash string }
	testwait.For(t, time.Minute, func() error {
		b, err := exec.CommandContext(ctx, filepath.Join(procs.BinDir(), "dowsectl"), "token", "create",
			"--kubeconfig", c.Kubeconfig, "--namespace", ns, "--node", c.NodeName, "--ttl", "10m", "--output", "json").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, b)
		}
		return json.Unmarshal(b, &tok)
	})

	// The PLC on the site's network: the node reaches it through a cut.
	var writesMu sync.Mutex
	var writes []string
	plc, err := modbusplc.StartOn(host, func(v int16) {
		writesMu.Lock()
		defer writesMu.Unlock()
		writes = append(writes, fmt.Sprintf("%d@%s", v, time.Now().Format(time.RFC3339Nano)))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer plc.Stop()
	writesSince := func(since time.Time, value int16) int {
		writesMu.Lock()
		defer writesMu.Unlock()
		n := 0
		for _, w := range writes {
			v, at, _ := strings.Cut(w, "@")
			when, _ := time.Parse(time.RFC3339Nano, at)
			if v == strconv.Itoa(int(value)) && when.After(since) {
				n++
			}
		}
		return n
	}

	// Autonomy on the node, then the chart.
	enableAutonomy(t, ctx, c, agentLatest)
	valuesFile, ports := nodeValues(t, c, map[string]any{
		"debugEcho":  map[string]any{"discovery": map[string]any{"enabled": true}},
		"modbus":     map[string]any{"discovery": map[string]any{"enabled": true}},
		"controller": map[string]any{"enabled": false},
		"hooks":      map[string]any{"enabled": false},
		"nodeAPI":    map[string]any{"enabled": true, "dir": filepath.Join(c.StateDir, "dowse-node-api")},
		"link": map[string]any{"enabled": true, "server": net.JoinHostPort(host, strconv.Itoa(cloud.ws)),
			"authURL": "https://" + net.JoinHostPort(host, strconv.Itoa(cloud.auth)), "caCertHash": tok.CACertHash,
			"ca": map[string]any{"generate": false}, "quic": false},
	})
	if out, err := kube.HelmCommand(ctx, t, "install", "dowse", filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse"),
		"--namespace", ns, "--values", valuesFile, "--kubeconfig", c.Kubeconfig).CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	parts := []string{"dowse-agent", "dowse-debug-echo-discovery", "dowse-modbus-discovery"}
	waitReady(t, ctx, cl, ns, parts)
	waitMetric(t, ctx, cloud.metrics, "dowse_cloudhub_connected_nodes 1")
	applyWorkloads(t, ctx, cl, plc.Addr, workloadOptions{})
	dev := waitTwin(t, ctx, cl, "setpoint", "21")
	setDesired(t, ctx, cl, dev, "setpoint", "30")
	waitTwin(t, ctx, cl, "setpoint", "30")
	before := uids(t, ctx, cl)
	running := func() map[string]string { return runningOn(t, ctx, c) }
	// Every pod of Dowse and of its devices (agent, handlers, broker and
	// mapper Pods), as namespace/name.
	var expected []string
	testwait.For(t, 2*time.Minute, func() error {
		expected = nil
		for _, n := range []string{ns, "default"} {
			pods, err := c.Client.CoreV1().Pods(n).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodRunning {
					expected = append(expected, p.Namespace+"/"+p.Name)
				}
			}
		}
		if len(expected) < 5 {
			return fmt.Errorf("before the cut only %v run", expected)
		}
		return nil
	})
	missing := func() []string {
		got := running()
		var out []string
		for _, e := range expected {
			found := false
			for k := range got {
				found = found || strings.HasPrefix(k, e+"/")
			}
			if !found {
				out = append(out, e)
			}
		}
		return out
	}
	if m := missing(); len(m) > 0 {
		t.Fatalf("before the cut %v do not run on the node", m)
	}

	// Cut off (but for the PLC and the agent's metrics), and reboot.
	agentMetrics := net.JoinHostPort(c.PodNetwork.NodeIP, strconv.Itoa(ports.agentMetrics))
	plcPort := plc.Addr[strings.LastIndexByte(plc.Addr, ':')+1:]
	cutProxiedNode(t, ctx, c, "tcp dport "+plcPort, fmt.Sprintf("tcp sport %d", ports.agentMetrics))
	rebooted := time.Now()
	if err := c.Reboot(ctx); err != nil {
		t.Fatal(err)
	}
	kubeletUp := time.Now()
	testwait.For(t, time.Minute, func() error {
		if m := missing(); len(m) > 0 {
			return fmt.Errorf("after the offline reboot %v do not run", m)
		}
		return nil
	})
	t.Logf("offline reboot: %d pods (agent, handlers, mapper, brokers) running %s after the kubelet started", len(expected), time.Since(kubeletUp).Round(100*time.Millisecond))
	testwait.For(t, time.Minute, func() error {
		if n := writesSince(rebooted, 30); n == 0 {
			return fmt.Errorf("the mapper has not written the desired setpoint since the reboot")
		}
		return nil
	})
	t.Logf("the desired setpoint written to the PLC %s after the kubelet started, offline", time.Since(kubeletUp).Round(100*time.Millisecond))
	// Meanwhile an operator sets the PLC's setpoint on site: the mapper
	// reads it, offline, and the reading waits at the edge.
	h := modbus.NewTCPClientHandler(plc.Addr)
	h.SlaveId, h.Timeout = 1, 2*time.Second
	if _, err := modbus.NewClient(h).WriteSingleRegister(0, 25); err != nil {
		t.Fatalf("setting the PLC's setpoint on site: %v", err)
	}
	_ = h.Close()
	var queued float64
	testwait.For(t, time.Minute, func() error {
		got, err := promtest.Scrape("http://"+agentMetrics+"/metrics", "dowse_edgehub_queued_messages")
		if err != nil {
			return err
		}
		if queued = got["dowse_edgehub_queued_messages"]; queued < 5 {
			return fmt.Errorf("%v readings queued at the edge", queued)
		}
		return nil
	})
	t.Logf("offline, %v readings queued at the edge", queued)
	// Long enough for the mapper to read the setpoint set on site.
	time.Sleep(3 * time.Second)

	reconnectNode(t, ctx, c)
	reconnected := time.Now()
	testwait.For(t, time.Minute, func() error {
		got, err := promtest.Scrape("http://"+agentMetrics+"/metrics", "dowse_edgehub_queued_messages")
		if err != nil {
			return err
		}
		dropped, err := promtest.Scrape("http://"+agentMetrics+"/metrics", "dowse_edgehub_dropped_messages_total")
		if err != nil {
			return err
		}
		maps.Copy(got, dropped)
		if got["dowse_edgehub_dropped_messages_total"] != 0 {
			return fmt.Errorf("the edge dropped %v messages", got["dowse_edgehub_dropped_messages_total"])
		}
		if got["dowse_edgehub_queued_messages"] != 0 {
			return fmt.Errorf("%v messages still queued", got["dowse_edgehub_queued_messages"])
		}
		return nil
	})
	t.Logf("after reconnecting, the edge's queue drained in %s", time.Since(reconnected).Round(100*time.Millisecond))
	waitTwin(t, ctx, cl, "setpoint", "25")
	t.Logf("after reconnecting, the Device's status has the setpoint read offline in %s", time.Since(reconnected).Round(100*time.Millisecond))
	// The device's mapper and an Instance's broker, from the command line,
	// through the API server.
	var mapperPods corev1.PodList
	if err := cl.List(ctx, &mapperPods, client.InNamespace("default"), client.MatchingLabels{"dowse.dev/mapper": "true"}); err != nil || len(mapperPods.Items) != 1 {
		t.Fatalf("mapper Pods: %v (%d)", err, len(mapperPods.Items))
	}
	mport := mapperPods.Items[0].Spec.Containers[0].Ports[0].ContainerPort
	dowsectl := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, filepath.Join(procs.BinDir(), "dowsectl"), append([]string{"--kubeconfig", c.Kubeconfig, "--namespace", "default"}, args...)...)
	}
	local := portForward(t, dowsectl("port-forward", "device/"+dev.Name, fmt.Sprintf(":%d", mport)))
	if got, err := promtest.Scrape("http://"+local+"/metrics", "dowse_mapper_devices"); err != nil || len(got) == 0 {
		t.Errorf("the mapper's metrics through dowsectl port-forward device/%s: %v %v", dev.Name, got, err)
	}
	var brokerPods corev1.PodList
	if err := cl.List(ctx, &brokerPods, client.InNamespace("default"), client.HasLabels{"dowse.dev/instance"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range brokerPods.Items {
		if p.Labels["dowse.dev/mapper"] == "true" {
			continue
		}
		local := portForward(t, dowsectl("port-forward", "instance/"+p.Labels["dowse.dev/instance"], fmt.Sprintf(":%d", p.Spec.Containers[0].Ports[0].ContainerPort)))
		resp, err := http.Get("http://" + local + "/")
		if err != nil {
			t.Fatalf("the broker through dowsectl port-forward instance/%s: %v", p.Labels["dowse.dev/instance"], err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("the broker through dowsectl port-forward answered %s", resp.Status)
		}
		break
	}
	after := uids(t, ctx, cl)
	for what, m := range map[string][2]map[string]types.UID{"Instance": {before.instances, after.instances}, "Device": {before.devices, after.devices},
		"broker Pod": {before.pods, after.pods}, "mapper Pod": {before.mappers, after.mappers}} {
		for n, uid := range m[0] {
			if m[1][n] != uid {
				t.Errorf("%s %s was %s before the reboot and is %q after", what, n, uid, m[1][n])
			}
		}
	}
}
