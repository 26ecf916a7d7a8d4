package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	readingsv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// readingsRequests counts the readings API's requests a client makes, by
// kind: list, initial (a watch with sendInitialEvents: client-go's
// watch-list, which a reflector makes instead of a list), rewatch (a
// watch from a resourceVersion) and gone (answered 410).
type readingsRequests struct {
	mu   sync.Mutex
	byOp map[string]int
	next http.RoundTripper
}

func (c *readingsRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if !strings.Contains(r.URL.Path, "/"+readingsv1.Resource) {
		return resp, err
	}
	q := r.URL.Query()
	op := "list"
	switch {
	case q.Get("watch") != "true":
	case q.Get("sendInitialEvents") == "true" || q.Get("resourceVersion") == "" || q.Get("resourceVersion") == "0":
		op = "initial"
	default:
		op = "rewatch"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byOp[op]++
	if err == nil && resp.StatusCode == http.StatusGone {
		c.byOp["gone"]++
	}
	return resp, err
}

func (c *readingsRequests) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.byOp {
		out[k] = v
	}
	return out
}

// countOfObject is a DeviceReading's count property (-1 without one).
func countOfObject(obj any) (string, int64) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return "", -1
	}
	var r readingsv1.DeviceReading
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
		return u.GetName(), -1
	}
	p := r.Property("count")
	if p == nil {
		return r.Name, -1
	}
	v, _ := strconv.ParseInt(p.Value, 10, 64)
	return r.Name, v
}

// TestReadingsAPIReplayAndExplain: two replicas serve the live readings
// API through the API server's aggregator, with simulated edges
// reporting counters. kubectl explain knows DeviceReadings and their
// fields (the OpenAPI the replicas publish, merged by the aggregator). A
// watch from a list's resourceVersion first gets what came between the
// list and the watch: every Device's last counter (MODIFIED), a Device
// created since (ADDED) and one deleted since (DELETED); a watch from a
// resourceVersion older than the replica can answer for is 410 Gone. A
// client-go informer, whose watches end every 2 s, stays in step with the
// counters through its rewatches from the last resourceVersion, with one
// initial sync and no relist.
func TestReadingsAPIReplayAndExplain(t *testing.T) {
	const nodes, perNode = 2, 3
	kubectl := kubectlPath(t)
	ctx := context.Background()
	f := startFleetWith(t, fleetOptions{replicas: 2, aggregator: true})
	c := f.client
	ca := registerReadingsAPI(t, ctx, f, f.replicas[0])
	edges, devName := startCounterEdges(t, ctx, f, ca, nodes, perNode)
	// One node on each replica, so that replays gather from both.
	testwait.For(t, time.Minute, func() error {
		holders, err := f.holders(ctx)
		if err != nil {
			return err
		}
		if holders[edges[0].node] == "" || holders[edges[0].node] == holders[edges[1].node] {
			return fmt.Errorf("holders %v, want one node on each replica", holders)
		}
		return nil
	})
	reported := func() map[string]int64 {
		out := map[string]int64{}
		for n, e := range edges {
			for i := range perNode {
				out[devName(n, i)] = e.count[i].Load()
			}
		}
		return out
	}

	// kubectl explain, through the aggregator's OpenAPI v3 and v2.
	explain := func(args ...string) (string, error) {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, kubectl, append([]string{"--kubeconfig", f.kubeconfig, "explain"}, args...)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("kubectl explain %v: %w: %s", args, err, errOut.String())
		}
		return out.String(), nil
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{readingsv1.Resource}, []string{"DeviceReading", readingsv1.Group, "node", "replica", "state", "properties", "metadata"}},
		{[]string{readingsv1.Resource + ".properties"}, []string{"history", "source", "newest reported value"}},
		{[]string{readingsv1.Resource, "--output=plaintext-openapiv2"}, []string{"DeviceReading", "replica", "properties"}},
	} {
		testwait.For(t, time.Minute, func() error {
			out, err := explain(tc.args...)
			if err != nil {
				return err
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					return fmt.Errorf("kubectl explain %v lacks %q:\n%s", tc.args, w, out)
				}
			}
			t.Logf("kubectl explain %v:\n%s", tc.args, out)
			return nil
		})
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	requests := &readingsRequests{byOp: map[string]int{}}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { requests.next = rt; return requests })
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	api := dc.Resource(readingsv1.GVR()).Namespace("default")

	// A list, values reported after it, a Device created and one deleted;
	// then a watch from the list's resourceVersion, the reports stopped so
	// that only a replay can tell the watch what they were.
	stopReports := reportCounters(edges, perNode, devName)
	testwait.For(t, 30*time.Second, func() error {
		list, err := api.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, it := range list.Items {
			if _, v := countOfObject(&it); v <= 0 {
				return fmt.Errorf("%s has no count yet", it.GetName())
			}
		}
		return nil
	})
	list, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]int64{}
	for _, it := range list.Items {
		name, v := countOfObject(&it)
		listed[name] = v
	}
	time.Sleep(1500 * time.Millisecond)
	stopReports()
	gone, added := devName(0, perNode-1), "rd-added"
	if err := c.Delete(ctx, &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: gone}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: added},
		Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "counter"}, NodeName: edges[0].node}}); err != nil {
		t.Fatal(err)
	}
	final := reported()
	delete(final, gone)
	for name, v := range final {
		if v <= listed[name] {
			t.Fatalf("%s: reported %d, listed %d: nothing was reported between the list and the watch", name, v, listed[name])
		}
	}
	time.Sleep(time.Second) // the last reports reach the replicas
	wctx, stopWatch := context.WithTimeout(ctx, 30*time.Second)
	w, err := api.Watch(wctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion(), AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	events := map[string]string{}
	seen := map[string]int64{}
	missing := func() error {
		for name, v := range final {
			if seen[name] != v || events[name] != string(watch.Modified) {
				return fmt.Errorf("%s: %s %d, want MODIFIED %d", name, events[name], seen[name], v)
			}
		}
		if events[gone] != string(watch.Deleted) || events[added] != string(watch.Added) {
			return fmt.Errorf("%s: %q, %s: %q, want DELETED and ADDED", gone, events[gone], added, events[added])
		}
		return nil
	}
	for missing() != nil {
		ev, ok := <-w.ResultChan()
		if !ok {
			break
		}
		if ev.Type == watch.Bookmark || ev.Type == watch.Error {
			continue
		}
		name, v := countOfObject(ev.Object)
		events[name], seen[name] = string(ev.Type), v
	}
	w.Stop()
	stopWatch()
	if err := missing(); err != nil {
		t.Errorf("the watch from the list's resourceVersion: %v (events %v, counts %v)", err, events, seen)
	}

	// Older than the replicas followed the Devices: 410 Gone.
	_, err = api.Watch(ctx, metav1.ListOptions{ResourceVersion: "1"})
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Errorf("a watch from resourceVersion 1: %v, want 410 Gone", err)
	}

	// An informer whose watches end every 2 s: it rewatches from the
	// last resourceVersion it saw, and stays in step without a relist.
	before := requests.counts()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return api.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.TimeoutSeconds = ptr.To[int64](2)
			return api.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, dc), &unstructured.Unstructured{}, 0, cache.Indexers{})
	var mu sync.Mutex
	var back []string
	last := map[string]int64{}
	track := func(obj any) {
		name, v := countOfObject(obj)
		mu.Lock()
		defer mu.Unlock()
		if l, ok := last[name]; ok && v < l {
			back = append(back, fmt.Sprintf("%s from %d to %d", name, last[name], v))
		}
		last[name] = v
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: track, UpdateFunc: func(_, o any) { track(o) }}); err != nil {
		t.Fatal(err)
	}
	ictx, stopInformer := context.WithCancel(ctx)
	defer stopInformer()
	go inf.RunWithContext(ictx)
	if !cache.WaitForCacheSync(ictx.Done(), inf.HasSynced) {
		t.Fatal("the informer never synced")
	}
	stopReports = reportCounters(edges, perNode, devName)
	time.Sleep(9 * time.Second) // four watches or more
	stopReports()
	want := reported()
	delete(want, gone)
	testwait.For(t, 30*time.Second, func() error {
		names := map[string]bool{}
		for _, obj := range inf.GetStore().List() {
			name, v := countOfObject(obj)
			names[name] = true
			if w, ok := want[name]; ok && v != w {
				return fmt.Errorf("the informer has %s at %d, the edge reported %d", name, v, w)
			}
		}
		for name := range want {
			if !names[name] {
				return fmt.Errorf("the informer lacks %s", name)
			}
		}
		if names[gone] || !names[added] {
			return fmt.Errorf("the informer holds %v: want %s and not %s", names, added, gone)
		}
		return nil
	})
	after := requests.counts()
	syncs := after["list"] + after["initial"] - before["list"] - before["initial"]
	rewatches := after["rewatch"] - before["rewatch"]
	t.Logf("the informer's requests: %d initial syncs, %d rewatches, %d answered 410", syncs, rewatches, after["gone"]-before["gone"])
	if syncs != 1 || rewatches < 3 || after["gone"] != before["gone"] {
		t.Errorf("the informer made %d initial syncs (lists or watch-lists), %d rewatches, %d answered 410; want 1, at least 3 and none",
			syncs, rewatches, after["gone"]-before["gone"])
	}
	mu.Lock()
	defer mu.Unlock()
	if len(back) > 0 {
		t.Errorf("a counter went back in the informer %d times, first: %v", len(back), back[:min(5, len(back))])
	}
}
