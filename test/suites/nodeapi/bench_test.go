package nodeapi_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/dowse-dev/dowse/internal/agent/nodeapi"
)

// BenchmarkNodeReconnects: a node of 100 pods, each mounting a Secret and a
// ConfigMap, read through the node API proxy as its kubelet reads them
// (its pods, its Node, each Secret and ConfigMap by name: 202 informers).
// Cut off while 1,000 ConfigMaps change elsewhere, then back: it reports
// the requests the proxy passed to the API server until its clients were
// in step again (lists, watches), against the 202 lists of a relist of
// everything the node reads, and the bytes the store keeps per pod.
func BenchmarkNodeReconnects(b *testing.B) {
	const pods = 100
	ctx := b.Context()
	dir := b.TempDir()
	ns := suite.Namespace(b)
	admin := suite.Clientset
	node := "bench-node"
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	for i := range pods {
		n := strconv.Itoa(i)
		if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s-" + n},
			Data: map[string][]byte{"password": []byte("secret-" + n)}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c-" + n},
			Data: map[string]string{"config.yaml": "unit: " + n}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-" + n, Namespace: ns}, Spec: corev1.PodSpec{NodeName: node,
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}},
			Volumes: []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s-" + n}}},
				{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "c-" + n}}}}}}}
		if _, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}

	kc, upstream, cut := nodeUpstream(b, dir)
	reg := prometheus.NewRegistry()
	srv, err := nodeapi.New(nodeapi.Config{Listen: "127.0.0.1:0", Dir: filepath.Join(dir, "node-api"), Upstream: upstream,
		ProbeEvery: 200 * time.Millisecond, ProbeTimeout: time.Second, Log: zap.New(), Metrics: reg})
	if err != nil {
		b.Fatal(err)
	}
	srvCtx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { _ = srv.Start(srvCtx) }()
	through, err := nodeapi.KubeletKubeconfig(kc, srv.Addr(), filepath.Join(dir, "node-api"))
	if err != nil {
		b.Fatal(err)
	}
	nodeCfg, err := clientcmd.NewDefaultClientConfig(*through, nil).ClientConfig()
	if err != nil {
		b.Fatal(err)
	}
	nodeCfg.ContentType = "application/vnd.kubernetes.protobuf"
	nodeCfg.QPS, nodeCfg.Burst = 1000, 1000
	cs := kubernetes.NewForConfigOrDie(nodeCfg)

	// The kubelet's informers: its pods, its Node, each Secret and
	// ConfigMap its pods mount, by name.
	informerCtx, stopInformers := context.WithCancel(ctx)
	defer stopInformers()
	var synced []cache.InformerSynced
	start := func(f informers.SharedInformerFactory, inf cache.SharedIndexInformer) {
		synced = append(synced, inf.HasSynced)
		f.Start(informerCtx.Done())
	}
	byField := func(ns, sel string) informers.SharedInformerFactory {
		return informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = sel }))
	}
	f := byField("", "spec.nodeName="+node)
	start(f, f.Core().V1().Pods().Informer())
	f = byField("", "metadata.name="+node)
	start(f, f.Core().V1().Nodes().Informer())
	for i := range pods {
		n := strconv.Itoa(i)
		f = byField(ns, "metadata.name=s-"+n)
		start(f, f.Core().V1().Secrets().Informer())
		f = byField(ns, "metadata.name=c-"+n)
		start(f, f.Core().V1().ConfigMaps().Informer())
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		b.Fatal("informers not synced")
	}
	time.Sleep(1500 * time.Millisecond) // the store's write to disk
	storeBytes := gauge(b, reg, "dowse_node_api_store_bytes")
	storeObjects := gauge(b, reg, "dowse_node_api_store_objects")

	cut.Blackhole(true)
	waitFor(b, 20*time.Second, "offline", func() error {
		if off, _ := srv.Offline(); !off {
			return errors.New("still online")
		}
		return nil
	})
	// Elsewhere, the cluster moves on.
	churn := suite.Namespace(b)
	for i := range 1000 {
		if _, err := admin.CoreV1().ConfigMaps(churn).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x-" + strconv.Itoa(i)}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	before := counts(b, reg)
	b.ResetTimer()
	began := time.Now()
	cut.Blackhole(false)
	// In step again: no request passed on for 2 s.
	last, lastChange := counts(b, reg), time.Now()
	for time.Since(lastChange) < 2*time.Second {
		time.Sleep(100 * time.Millisecond)
		if now := counts(b, reg); fmt.Sprint(now) != fmt.Sprint(last) {
			last, lastChange = now, time.Now()
		}
	}
	settled := lastChange.Sub(began)
	b.StopTimer()
	informersN := float64(2 + 2*pods)
	b.ReportMetric(last["list"]-before["list"], "lists")
	b.ReportMetric(last["watch"]-before["watch"], "watches")
	b.ReportMetric(last["get"]-before["get"], "gets")
	b.ReportMetric(informersN, "informers")
	b.ReportMetric(settled.Seconds(), "s-to-settle")
	b.ReportMetric(storeBytes/pods, "store-B/pod")
	b.ReportMetric(storeObjects, "objects-kept")
}

func gauge(b *testing.B, reg *prometheus.Registry, name string) float64 {
	b.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	b.Fatalf("no %s", name)
	return 0
}

func counts(b *testing.B, reg *prometheus.Registry) map[string]float64 {
	b.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "dowse_node_api_upstream_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[verbOf(m)] = m.GetCounter().GetValue()
		}
	}
	return out
}

func verbOf(m *dto.Metric) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == "verb" {
			return l.GetValue()
		}
	}
	return ""
}
