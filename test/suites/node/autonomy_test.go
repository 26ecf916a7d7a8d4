package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

const agentImage = "ghcr.io/dowse-dev/dowse-agent:test"

// TestNodeRebootsOfflineAndRunsItsPods: the real node in its own network
// namespace is cut off from the machine (the API server) by nftables and
// rebooted: the kubelet and containerd killed, every container with them,
// the runtime state a reboot clears gone. Without Dowse's node API proxy the
// node comes back with none of its pods. With it (a static pod of the agent
// image, `dowse-agent node-api`, the kubelet's kubeconfig pointed at it),
// the pods run again while the node is still cut off, with the Secret they
// had; once the network is back, the pod deleted in the cloud meanwhile
// stops, the Secret changed meanwhile reaches the pod, and the pod that ran
// through the cut is the same object.
func TestNodeRebootsOfflineAndRunsItsPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := startClusterWith(t, ctx, cluster.Options{PodNetwork: true, StaticPods: true},
		[2]string{"./agent/cmd/dowse-agent", agentImage})
	cs := c.Client
	ns := "default"
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "plc"},
		Data: map[string][]byte{"password": []byte("before-the-cut")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runPod := func(name string) types.UID {
		t.Helper()
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: c.NodeName,
				Containers: []corev1.Container{{Name: "c", Image: probeImage, ImagePullPolicy: corev1.PullNever,
					Args:         []string{"serve:8080"},
					VolumeMounts: []corev1.VolumeMount{{Name: "plc", MountPath: "/plc"}}}},
				Volumes: []corev1.Volume{{Name: "plc", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "plc"}}}}}}
		p, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 2*time.Minute, func() error {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				return fmt.Errorf("pod %s not running (%w)", name, err)
			}
			return nil
		})
		return p.UID
	}
	running := func() map[string]string { return runningOn(t, ctx, c) }
	cutOff := func() { cutNode(t, ctx, c) }
	reconnect := func() { reconnectNode(t, ctx, c) }

	keeps := runPod("keeps")

	// Today: a node rebooted offline comes back with nothing.
	cutOff()
	if err := c.Reboot(ctx); err != nil {
		t.Fatal(err)
	}
	testwait.Holds(t, 20*time.Second, func() error {
		if got := running(); got[ns+"/keeps/c"] != "" {
			return fmt.Errorf("without the node API proxy the pod ran again offline: %v (the test no longer shows the gap)", got)
		}
		return nil
	})
	t.Log("without the node API proxy: no pod runs 20 s after an offline reboot")
	reconnect()
	testwait.For(t, 2*time.Minute, func() error {
		if running()[ns+"/keeps/c"] == "" {
			return fmt.Errorf("pod keeps not running again after reconnecting")
		}
		return nil
	})

	// Autonomy on, as the user guide says: the static pod dowsectl prints,
	// then the kubelet on the kubeconfig the proxy writes.
	enableAutonomy(t, ctx, c, agentImage)
	proxyRunning := func() error {
		for k := range running() {
			if strings.HasPrefix(k, "kube-system/dowse-node-api-") {
				return nil
			}
		}
		return fmt.Errorf("the node API proxy does not run")
	}
	testwait.For(t, 2*time.Minute, proxyRunning)
	// The kubelet reaches the API server through it: a new pod runs.
	runPod("deleted-in-the-cut")
	// What the store keeps reaches its disk within a second.
	time.Sleep(2 * time.Second)

	cutProxiedNode(t, ctx, c)
	proxyLog := func() string { return nodeAPILog(c) }
	// Meanwhile, in the cloud.
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "deleted-in-the-cut", *metav1.NewDeleteOptions(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "plc", Namespace: ns},
		Data: map[string][]byte{"password": []byte("after-the-cut")}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	begin := time.Now()
	if err := c.Reboot(ctx); err != nil {
		t.Fatal(err)
	}
	kubeletUp := time.Now()
	testwait.For(t, time.Minute, func() error {
		got := running()
		for _, want := range []string{ns + "/keeps/c", ns + "/deleted-in-the-cut/c"} {
			if got[want] == "" {
				return fmt.Errorf("%s does not run after the offline reboot (running: %v)", want, got)
			}
		}
		return proxyRunning()
	})
	t.Logf("offline reboot: kubelet up %s after the kill, its pods running %s after that",
		kubeletUp.Sub(begin).Round(100*time.Millisecond), time.Since(kubeletUp).Round(100*time.Millisecond))
	secretFile := func(uid types.UID) string {
		b, _ := os.ReadFile(filepath.Join(c.StateDir, "kubelet", "pods", string(uid), "volumes", "kubernetes.io~secret", "plc", "password"))
		return string(b)
	}
	testwait.For(t, 30*time.Second, func() error {
		if got := secretFile(keeps); got != "before-the-cut" {
			return fmt.Errorf("the pod's Secret volume offline holds %q", got)
		}
		return nil
	})

	reconnect()
	testwait.For(t, time.Minute, func() error {
		got := running()
		if got[ns+"/deleted-in-the-cut/c"] != "" {
			return fmt.Errorf("the pod deleted in the cloud during the cut still runs")
		}
		if got[ns+"/keeps/c"] == "" {
			return fmt.Errorf("pod keeps stopped")
		}
		if s := secretFile(keeps); s != "after-the-cut" {
			return fmt.Errorf("the pod's Secret volume holds %q, not the value set during the cut", s)
		}
		return nil
	})
	p, err := cs.CoreV1().Pods(ns).Get(ctx, "keeps", metav1.GetOptions{})
	if err != nil || p.UID != keeps {
		t.Fatalf("pod keeps was made again (%v): uid %s, was %s", err, p.UID, keeps)
	}
	if !strings.Contains(proxyLog(), "reached again") {
		t.Errorf("the proxy's log does not say it reached the API server again:\n%s", proxyLog())
	}
	// The Node's Event tells how long the node ran from its store.
	testwait.For(t, 30*time.Second, func() error {
		evs, err := cs.EventsV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "reason=ServedOffline"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Kind == "Node" && e.Regarding.Name == c.NodeName && strings.Contains(e.Note, "answered") {
				t.Logf("the Node's Event: %s", e.Note)
				return nil
			}
		}
		return fmt.Errorf("no ServedOffline Event of the Node among %d", len(evs.Items))
	})
}

// enableAutonomy runs the node API proxy as the static pod `dowsectl node
// autonomy` prints and restarts the kubelet on the kubeconfig it writes.
func enableAutonomy(t *testing.T, ctx context.Context, c *cluster.Cluster, image string) {
	t.Helper()
	dir := filepath.Join(c.StateDir, "dowse-node-api")
	manifest, err := exec.CommandContext(ctx, filepath.Join(procs.BinDir(), "dowsectl"), "node", "autonomy",
		"--image", image, "--upstream-kubeconfig", c.Kubeconfig, "--cert-dir", "", "--dir", dir, "--pod-resources-dir", filepath.Join(c.StateDir, "kubelet", "pod-resources")).Output()
	if err != nil {
		t.Fatalf("dowsectl node autonomy: %v", err)
	}
	if err := os.WriteFile(filepath.Join(c.StaticPodDir, "dowse-node-api.yaml"), manifest, 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "kubelet.conf")
	testwait.For(t, 2*time.Minute, func() error {
		_, err := os.Stat(conf)
		return err
	})
	c.SetKubeletKubeconfig(conf)
	if err := c.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
}

// cutNode drops the node's traffic to the machine (the API server, the
// controller), its pods' too, but for the tcp ports given (a PLC on the
// site's network, the replies of a metrics endpoint the test scrapes): the
// network outside the node as a cut uplink leaves it.
func cutNode(t *testing.T, ctx context.Context, c *cluster.Cluster, keep ...string) {
	t.Helper()
	var rules strings.Builder
	for _, k := range keep {
		fmt.Fprintf(&rules, "  ip daddr %s %s accept\n", c.PodNetwork.HostIP, k)
	}
	fmt.Fprintf(&rules, "  ip daddr %s drop\n", c.PodNetwork.HostIP)
	nftNode(t, ctx, c, fmt.Sprintf("table inet dowse_offline {\n chain to_machine {\n  type filter hook output priority -10;\n%s }\n chain forwarded {\n  type filter hook forward priority -10;\n%s }\n}\n", rules.String(), rules.String()))
}

func reconnectNode(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	t.Helper()
	nftNode(t, ctx, c, "delete table inet dowse_offline\n")
}

func nftNode(t *testing.T, ctx context.Context, c *cluster.Cluster, rule string) {
	t.Helper()
	name, args := c.PodNetwork.Command("nft", []string{"-f", "-"})
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(rule)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
}

// nodeAPILog is what the node API proxy's containers logged.
func nodeAPILog(c *cluster.Cluster) string {
	logs, _ := filepath.Glob(filepath.Join(c.PodLogsDir, "kube-system_dowse-node-api-*", "node-api", "*.log"))
	var all strings.Builder
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		all.Write(b)
	}
	return all.String()
}

// cutProxiedNode is cutNode on a node that runs the node API proxy, and
// waits until the proxy says it lost the API server.
func cutProxiedNode(t *testing.T, ctx context.Context, c *cluster.Cluster, keep ...string) {
	t.Helper()
	before := strings.Count(nodeAPILog(c), "out of reach")
	cutNode(t, ctx, c, keep...)
	testwait.For(t, 30*time.Second, func() error {
		if strings.Count(nodeAPILog(c), "out of reach") <= before {
			return fmt.Errorf("the node API proxy has not noticed the cut")
		}
		return nil
	})
}

// runningOn is what runs on the node (cluster.RunningContainers).
func runningOn(t *testing.T, ctx context.Context, c *cluster.Cluster) map[string]string {
	t.Helper()
	got, err := c.RunningContainers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return got
}
