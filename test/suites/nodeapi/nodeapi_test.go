// Package nodeapi_test proves the node-local API proxy (internal/agent/nodeapi)
// on a real API server: what a node's clients read through it is answered
// from the node's disk while the API server cannot be reached, across a
// restart of the proxy, and after the cut its clients see what changed in the
// cloud meanwhile.
package nodeapi_test

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/dowse-dev/dowse/internal/agent/nodeapi"
	"github.com/dowse-dev/dowse/test/framework/faultproxy"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

var suite = &kube.Suite{NamespacePrefix: "node-api-"}

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

const node = "edge-1"

// proxyFor runs a node API proxy in dir towards upstream, listening on
// listen; it stops when the returned function is called or the test ends.
func proxyFor(t *testing.T, upstream *rest.Config, dir, listen string) (*nodeapi.Server, func()) {
	t.Helper()
	srv, err := nodeapi.New(nodeapi.Config{Listen: listen, Dir: dir, Upstream: upstream,
		ProbeEvery: 200 * time.Millisecond, ProbeTimeout: time.Second, Log: zap.New(zap.UseDevMode(true))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node API proxy: %v", err)
		}
	}
	var once bool
	t.Cleanup(func() {
		if !once {
			stop()
		}
	})
	return srv, func() { once = true; stop() }
}

// nodeUpstream is a node's own kubeconfig (a client certificate) and its
// client configuration, towards the API server through a proxy that can
// cut it off.
func nodeUpstream(t testing.TB, dir string) (*clientcmdapi.Config, *rest.Config, *faultproxy.TCP) {
	t.Helper()
	kcPath := filepath.Join(dir, "kubelet.kubeconfig")
	if err := suite.Kubeconfig(kcPath); err != nil {
		t.Fatal(err)
	}
	apiURL, err := url.Parse(suite.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	cut, err := faultproxy.NewTCP(apiURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cut.Close)
	kc, err := clientcmd.LoadFromFile(kcPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range kc.Clusters {
		c.Server = "https://" + cut.Addr()
	}
	upstream, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	return kc, upstream, cut
}

func TestNodeKeepsWhatItReadThroughACutAndARestart(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	ns := suite.Namespace(t)
	admin := suite.Clientset

	kc, upstream, cut := nodeUpstream(t, dir)
	storeDir := filepath.Join(dir, "node-api")
	srv, stop := proxyFor(t, upstream, storeDir, "127.0.0.1:0")
	listen := srv.Addr()
	through, err := nodeapi.KubeletKubeconfig(kc, listen, storeDir)
	if err != nil {
		t.Fatal(err)
	}
	nodeCfg, err := clientcmd.NewDefaultClientConfig(*through, nil).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	// As the kubelet asks: protobuf first.
	nodeCfg.ContentType = "application/vnd.kubernetes.protobuf"
	nodeCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cs := kubernetes.NewForConfigOrDie(nodeCfg)

	// Another certificate of the same name and CA, another key: not the
	// node's, refused at the handshake.
	otherPath := filepath.Join(dir, "other.kubeconfig")
	if err := suite.Kubeconfig(otherPath); err != nil {
		t.Fatal(err)
	}
	other, err := clientcmd.LoadFromFile(otherPath)
	if err != nil {
		t.Fatal(err)
	}
	otherThrough, err := nodeapi.KubeletKubeconfig(other, listen, storeDir)
	if err != nil {
		t.Fatal(err)
	}
	otherCfg, err := clientcmd.NewDefaultClientConfig(*otherThrough, nil).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(otherCfg).CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err == nil {
		t.Error("a certificate that is not the node's was passed on")
	}

	secret := "before-the-cut-" + rand.String(12)
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "plc"},
		Data: map[string][]byte{"password": []byte(secret)}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a write through the proxy: %v", err)
	}
	for _, name := range []string{"stays", "deleted-in-the-cut"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: "another-node", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The node's informer, as the kubelet's: its pods by field selector.
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.nodeName=" + node
	}))
	pods := factory.Core().V1().Pods().Informer()
	informerCtx, stopInformer := context.WithCancel(ctx)
	defer stopInformer()
	factory.Start(informerCtx.Done())
	podNames := func() []string {
		var out []string
		for _, o := range pods.GetStore().List() {
			if p := o.(*corev1.Pod); p.Namespace == ns {
				out = append(out, p.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	waitFor(t, 30*time.Second, "the informer through the proxy has the node's two pods", func() error {
		if got := podNames(); !slices.Equal(got, []string{"deleted-in-the-cut", "stays"}) {
			return errors.New(strings.Join(got, ","))
		}
		return nil
	})
	if _, err := cs.CoreV1().Secrets(ns).Get(ctx, "plc", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Discovery().ServerResourcesForGroupVersion("v1"); err != nil {
		t.Fatal(err)
	}
	// A moment for the store's write to disk (once a second).
	time.Sleep(1500 * time.Millisecond)

	cut.Blackhole(true)
	waitFor(t, 20*time.Second, "the proxy notices the cut", func() error {
		if off, _ := srv.Offline(); !off {
			return errors.New("still online")
		}
		return nil
	})
	// Meanwhile, in the cloud.
	if err := admin.CoreV1().Pods(ns).Delete(ctx, "deleted-in-the-cut", *metav1.NewDeleteOptions(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "plc", Namespace: ns},
		Data: map[string][]byte{"password": []byte("after-the-cut")}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	offlineReads := func(when string) {
		t.Helper()
		list, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			t.Fatalf("%s: the node's pods offline: %v", when, err)
		}
		var names []string
		for _, p := range list.Items {
			if p.Namespace == ns {
				names = append(names, p.Name)
			}
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"deleted-in-the-cut", "stays"}) {
			t.Errorf("%s: the node's pods offline are %v, want the two it read", when, names)
		}
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, "plc", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: the Secret offline: %v", when, err)
		}
		if string(s.Data["password"]) != secret {
			t.Errorf("%s: the Secret offline holds %q, want %q", when, s.Data["password"], secret)
		}
		_, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "w"}}, metav1.CreateOptions{})
		if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "cannot be reached") {
			t.Errorf("%s: a write offline answered %v, want 503 saying the API server cannot be reached", when, err)
		}
		_, err = cs.CoreV1().Secrets(ns).Get(ctx, "never-read", metav1.GetOptions{})
		if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "not kept") {
			t.Errorf("%s: a Secret never read answered %v, want 503 saying it is not kept", when, err)
		}
	}
	offlineReads("offline")
	if rl, err := cs.Discovery().ServerResourcesForGroupVersion("v1"); err != nil || len(rl.APIResources) == 0 {
		t.Errorf("discovery offline: %v", err)
	}
	if _, err := cs.Discovery().ServerResourcesForGroupVersion("apps/v1"); !apierrors.IsServiceUnavailable(err) {
		t.Errorf("discovery never asked online answered %v offline, want 503", err)
	}

	// The node reboots, still cut off: the proxy starts again from its disk.
	stop()
	raw, err := os.ReadFile(filepath.Join(storeDir, "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(secret)) {
		t.Error("the store holds the Secret's value in the clear")
	}
	for path, want := range map[string]os.FileMode{storeDir: 0o700 | os.ModeDir, filepath.Join(storeDir, "store.db"): 0o600, filepath.Join(storeDir, "seal.key"): 0o600} {
		if st, err := os.Stat(path); err != nil || st.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, st.Mode(), err, want)
		}
	}
	srv, _ = proxyFor(t, upstream, storeDir, listen)
	offlineReads("after a restart offline")
	if got := podNames(); !slices.Equal(got, []string{"deleted-in-the-cut", "stays"}) {
		t.Errorf("the informer offline has %v", got)
	}

	cut.Blackhole(false)
	waitFor(t, 30*time.Second, "after the cut the informer drops the pod deleted meanwhile", func() error {
		if got := podNames(); !slices.Equal(got, []string{"stays"}) {
			return errors.New(strings.Join(got, ","))
		}
		return nil
	})
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, "plc", metav1.GetOptions{})
	if err != nil || string(s.Data["password"]) != "after-the-cut" {
		t.Fatalf("the Secret after the cut: %v %q", err, s.Data["password"])
	}
	// What the node keeps followed: cut again, and the deleted pod and the
	// old Secret are gone from its store too.
	time.Sleep(1500 * time.Millisecond)
	cut.Blackhole(true)
	waitFor(t, 20*time.Second, "the proxy notices the second cut", func() error {
		if off, _ := srv.Offline(); !off {
			return errors.New("still online")
		}
		return nil
	})
	// Within the scope of a list it made (its pods, in one namespace), the
	// node is answered; beyond it (every pod of a namespace) it is not.
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(list.Items) != 1 || list.Items[0].Name != "stays" {
		t.Errorf("the node's pods of one namespace offline: %v %v", err, list)
	}
	if _, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "not kept") {
		t.Errorf("a list beyond what the node listed answered %v, want 503 saying it is not kept", err)
	}
	all, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range all.Items {
		if p.Namespace == ns && p.Name == "deleted-in-the-cut" {
			t.Error("the store still has the pod deleted during the first cut")
		}
		if p.Spec.NodeName != node {
			t.Errorf("the node's list offline holds %s/%s of node %q", p.Namespace, p.Name, p.Spec.NodeName)
		}
	}
	s, err = cs.CoreV1().Secrets(ns).Get(ctx, "plc", metav1.GetOptions{})
	if err != nil || string(s.Data["password"]) != "after-the-cut" {
		t.Errorf("the Secret in the store after the second cut: %v %q", err, s.Data["password"])
	}
}

func waitFor(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	testwait.For(t, d, func() error {
		if err := f(); err != nil {
			return errors.New(what + ": " + err.Error())
		}
		return nil
	})
}
