// Command isolation measures what other nodes' business costs an agent: the
// real dowse-agent, authenticated with its DaemonSet pod's token under the
// RBAC and admission policy of deploy/agent, holds 100 Instances of its own
// node on the real test control plane, and the bench prints its peak RSS and
// the API requests it makes in 60 idle seconds, first in an otherwise empty
// cluster, then with 10,000 other nodes' Instances (of the same
// Configuration), 5,000 Secrets and 5,000 ConfigMaps (1 KiB each) in it.
// Goal: RSS within 10% and no more requests in the crowded cluster. It
// writes only under its own temporary directory.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/bench/benchkit"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/promtest"
)

const (
	node = "bench-node"
	ns   = "plant"
)

type figures struct {
	peakRSS, peakAnon int // KiB
	writes, reads     float64
	syncTime          time.Duration
}

func main() {
	own := flag.Int("own", 100, "Instances of the agent's own node")
	others := flag.Int("other-instances", 10000, "other nodes' Instances in the crowded cluster")
	secrets := flag.Int("secrets", 5000, "Secrets (and as many ConfigMaps) in the crowded cluster")
	idle := flag.Duration("idle", 60*time.Second, "idle measurement window")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *own, *others, *secrets, *idle); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, own, others, secrets int, idle time.Duration) error {
	cp, err := kube.Start()
	if err != nil {
		return err
	}
	defer cp.Stop()
	dir, err := os.MkdirTemp("", "dowse-bench-isolation")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	admin, err := client.New(cp.Config, client.Options{Scheme: sch})
	if err != nil {
		return err
	}
	if err := kube.InstallAgentAccess(ctx, cp.Config); err != nil {
		return err
	}
	agentCfg, err := kube.AgentConfig(ctx, cp.Config, node)
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "agent.kubeconfig")
	if err := writeKubeconfig(kubeconfig, agentCfg); err != nil {
		return err
	}
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	descs := make([]string, own)
	for i := range descs {
		descs[i] = fmt.Sprintf("own-%04d", i)
	}
	raw, _ := json.Marshal(map[string]any{"descriptions": descs})
	if err := admin.Create(ctx, &v1alpha1.Configuration{
		ObjectMeta: metav1.ObjectMeta{Name: "cams", Namespace: ns},
		Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{
			Name: "debug-echo", DiscoveryDetails: &apiextensionsv1.JSON{Raw: raw}}},
	}); err != nil {
		return err
	}

	fmt.Printf("== empty cluster: %d Instances of the agent's own node\n", own)
	empty, err := measure(ctx, admin, filepath.Join(dir, "empty"), kubeconfig, own, idle)
	if err != nil {
		return fmt.Errorf("empty cluster: %w", err)
	}
	t0 := time.Now()
	if err := crowd(ctx, admin, others, secrets); err != nil {
		return err
	}
	fmt.Printf("== crowded cluster: + %d other nodes' Instances, %d Secrets, %d ConfigMaps of 1 KiB (made in %s)\n",
		others, secrets, secrets, time.Since(t0).Round(time.Second))
	crowded, err := measure(ctx, admin, filepath.Join(dir, "crowded"), kubeconfig, own, idle)
	if err != nil {
		return fmt.Errorf("crowded cluster: %w", err)
	}
	fmt.Printf("crowded/empty: peak RSS %.2f, idle requests %.0f vs %.0f (goal: RSS ratio <= 1.10, no more requests)\n",
		float64(crowded.peakRSS)/float64(empty.peakRSS), crowded.writes+crowded.reads, empty.writes+empty.reads)
	return nil
}

// measure starts an agent and a debug-echo handler, waits until the agent
// holds its own Instances, counts its requests while idle, and stops them.
func measure(ctx context.Context, admin client.Client, dir, kubeconfig string, own int, idle time.Duration) (figures, error) {
	var f figures
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return f, err
	}
	port, err := procs.FreePort()
	if err != nil {
		return f, err
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	t0 := time.Now()
	ag, err := startAgent(dir, dowse.Agent{Kubeconfig: kubeconfig, Node: node, StateDir: dir, Metrics: port,
		CDISpecDir: filepath.Join(dir, "cdi")})
	if err != nil {
		return f, err
	}
	defer ag.Stop()
	h, err := start(dir, "dowse-debug-echo-discovery", "--state-dir", dir, "--shared")
	if err != nil {
		return f, err
	}
	defer h.Stop()
	anon := benchkit.SampleAnon(ag)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var list v1alpha1.InstanceList
		if err := admin.List(ctx, &list, client.InNamespace(ns), client.HasLabels{v1alpha1.NodeLabel(node)}); err != nil {
			return f, err
		}
		if len(list.Items) == own {
			break
		}
		if ag.Exited() {
			return f, fmt.Errorf("the agent exited; see %s", filepath.Join(dir, "dowse-agent.log"))
		}
		if time.Now().After(deadline) {
			return f, fmt.Errorf("agent holds %d of %d Instances after 5 minutes", len(list.Items), own)
		}
		time.Sleep(200 * time.Millisecond)
	}
	f.syncTime = time.Since(t0)
	time.Sleep(3 * time.Second) // status writes and watch events settle
	before, err := promtest.Scrape(metricsURL, "rest_client_requests_total")
	if err != nil {
		return f, err
	}
	select {
	case <-time.After(idle):
	case <-ctx.Done():
		return f, ctx.Err()
	}
	after, err := promtest.Scrape(metricsURL, "rest_client_requests_total")
	if err != nil {
		return f, err
	}
	for k, v := range after {
		if strings.Contains(k, `method="GET"`) {
			f.reads += v - before[k]
		} else {
			f.writes += v - before[k]
		}
	}
	anon.Stop()
	peakAnon := anon.Peak(ag.Name)
	if f.peakRSS, err = ag.PeakRSS(); err != nil {
		return f, err
	}
	f.peakAnon = peakAnon
	fmt.Printf("agent started and held its %d Instances in %s\n", own, f.syncTime.Round(time.Millisecond))
	fmt.Printf("agent API requests in %s idle: %.0f writes, %.0f reads (watches stay open)\n", idle, f.writes, f.reads)
	fmt.Printf("peak RSS dowse-agent: %.1f MiB (peak anonymous %.1f MiB)\n", float64(f.peakRSS)/1024, float64(peakAnon)/1024)
	return f, nil
}

// crowd fills the cluster with what the agent must not pay for: other
// nodes' Instances of the same Configuration (as their agents make them,
// each labelled for its node), and Secrets and ConfigMaps of 1 KiB.
func crowd(ctx context.Context, admin client.Client, others, secrets int) error {
	payload := strings.Repeat("x", 1024)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range others {
		g.Go(func() error {
			other := fmt.Sprintf("other-node-%05d", i)
			name := fmt.Sprintf("cams-other-%05d", i)
			return admin.Create(gctx, &v1alpha1.Instance{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{v1alpha1.NodeLabel(other): ""}},
				Spec: v1alpha1.InstanceSpec{ConfigurationName: "cams", DeviceID: name, Capacity: 1,
					BrokerProperties: map[string]string{"DEBUG_ECHO_DESCRIPTION": name}},
				Status: v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: other}}},
			})
		})
	}
	for i := range secrets {
		g.Go(func() error {
			return admin.Create(gctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s-%05d", i), Namespace: ns},
				StringData: map[string]string{"data": payload}})
		})
		g.Go(func() error {
			return admin.Create(gctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-%05d", i), Namespace: ns},
				Data: map[string]string{"data": payload}})
		})
	}
	return g.Wait()
}

// startAgent runs the agent logging to dir/dowse-agent.log.
func startAgent(dir string, a dowse.Agent) (*procs.Proc, error) {
	logf, err := os.Create(filepath.Join(dir, "dowse-agent.log"))
	if err != nil {
		return nil, err
	}
	return a.Start(logf)
}

func start(dir, name string, args ...string) (*procs.Proc, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	return procs.Start(name, logf, args...)
}

// writeKubeconfig writes cfg (server, CA and bearer token) for the agent.
func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["agent"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "agent"}
	kc.CurrentContext = "agent"
	return clientcmd.WriteToFile(*kc, path)
}
