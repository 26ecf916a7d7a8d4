package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/dowsectl"
	readingsv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// readingsService is the Service the readings APIService names in tests.
const readingsService = "dowse-readings"

// kubectlPath is kubectl: bin/k8s's, else the machine's.
func kubectlPath(t *testing.T) string {
	t.Helper()
	if p := filepath.Join(kube.BinDir(), "kubectl"); fileExists(p) {
		return p
	}
	if p, err := exec.LookPath("kubectl"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("kubectl is missing: build it with `make k8s` or install Debian's kubectl (hack/install-deps.sh)")
	}
	t.Skip("kubectl is missing: build it with `make k8s` or install Debian's kubectl (hack/install-deps.sh)")
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestReadingsAPI: two controller replicas serve the live readings API
// (readings.dowse.dev/v1alpha1) through the API server's aggregator (an
// APIService whose Service reaches replica 0), with simulated edges
// reporting a counter for their Devices several times a second while each
// replica's status budget is 2 writes a second, so that Device.status lags
// the edge. kubectl, as a user whose RBAC allows DeviceReadings in one
// namespace, sees every Device's newest counter (at least what was
// reported before it asked, newer than the status holds for some), the
// Devices of the nodes replica 1 holds included (forwarded); is refused in
// another namespace, and a user without RBAC is refused; the replicas'
// own authorization (a SubjectAccessReview) refuses a user the front proxy
// names without RBAC. A kubectl watch sees new values from both replicas,
// never going back. After kill -9 of replica 1, replica 0 takes its nodes
// and serves their new values.
func TestReadingsAPI(t *testing.T) {
	const nodes, perNode = 4, 3
	kubectl := kubectlPath(t)
	ctx := context.Background()
	f := startFleetWith(t, fleetOptions{replicas: 2, aggregator: true, args: []string{"--twin-status-budget", "2"}})
	c := f.client

	front := f.replicas[0]
	ca := registerReadingsAPI(t, ctx, f, front)

	// Users: alice may read DeviceReadings in default, bob nothing.
	for _, ns := range []string{"other"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "readings-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{readingsv1.Group}, Resources: []string{readingsv1.Resource}, Verbs: []string{"get", "list", "watch"}}}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "alice-readings"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "readings-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}}}); err != nil {
		t.Fatal(err)
	}
	alice, bob := filepath.Join(f.dir, "alice.kubeconfig"), filepath.Join(f.dir, "bob.kubeconfig")
	if err := f.cp.UserKubeconfig(alice, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := f.cp.UserKubeconfig(bob, "bob"); err != nil {
		t.Fatal(err)
	}

	edges, devName := startCounterEdges(t, ctx, f, ca, nodes, perNode)
	var holders map[string]string
	testwait.For(t, time.Minute, func() error {
		for _, e := range edges {
			if !e.hub.Connected() {
				return fmt.Errorf("%s has no session", e.node)
			}
		}
		var err error
		if holders, err = f.holders(ctx); err != nil {
			return err
		}
		per := map[string]int{}
		for _, e := range edges {
			per[holders[e.node]]++
		}
		if per[f.replicas[0].name] != nodes/2 || per[f.replicas[1].name] != nodes/2 {
			return fmt.Errorf("nodes per replica %v, want them spread evenly", per)
		}
		return nil
	})
	t.Logf("node holders: %v", holders)

	// The load: every Device's counter goes up every 200 ms.
	t.Cleanup(reportCounters(edges, perNode, devName))
	// A few seconds of it: each Device's status, two writes a second a
	// replica for its six Devices, falls behind.
	time.Sleep(3 * time.Second)

	run := func(kubeconfig string, args ...string) (string, string, error) {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		return out.String(), errOut.String(), err
	}
	// reported is every Device's counter as its edge last reported it.
	reported := func() map[string]int64 {
		out := map[string]int64{}
		for n, e := range edges {
			for i := range perNode {
				out[devName(n, i)] = e.count[i].Load()
			}
		}
		return out
	}
	readAll := func(kubeconfig string) (map[string]readingsv1.DeviceReading, error) {
		out, errOut, err := run(kubeconfig, "get", readingsv1.Resource, "-n", "default", "-o", "json")
		if err != nil {
			return nil, fmt.Errorf("kubectl get: %w: %s", err, errOut)
		}
		var list readingsv1.DeviceReadingList
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			return nil, fmt.Errorf("reading kubectl's output: %w: %s", err, out)
		}
		m := map[string]readingsv1.DeviceReading{}
		for _, r := range list.Items {
			m[r.Name] = r
		}
		return m, nil
	}
	countOf := func(r readingsv1.DeviceReading) (int64, string) {
		p := r.Property("count")
		if p == nil {
			return -1, ""
		}
		v, _ := strconv.ParseInt(p.Value, 10, 64)
		return v, p.Source
	}

	// kubectl get as alice: every Device, at least the counter reported
	// before it asked, live, from both replicas' nodes. The holders are read
	// again each time: the replicas may still move a node to even out.
	testwait.For(t, time.Minute, func() error {
		before := reported()
		got, err := readAll(alice)
		if err != nil {
			return err
		}
		holders, err := f.holders(ctx)
		if err != nil {
			return err
		}
		replicas := map[string]bool{}
		for name, want := range before {
			r, ok := got[name]
			if !ok {
				return fmt.Errorf("no reading of %s", name)
			}
			v, src := countOf(r)
			if v < want || src != readingsv1.SourceLive {
				return fmt.Errorf("%s: count %d (%s), the edge had reported %d", name, v, src, want)
			}
			replicas[r.Replica] = true
			if r.Replica != holders[r.Node] {
				return fmt.Errorf("%s: served by %q, its node %s is held by %s", name, r.Replica, r.Node, holders[r.Node])
			}
		}
		if len(replicas) != 2 {
			return fmt.Errorf("readings came from %v, want both replicas", replicas)
		}
		return nil
	})
	// Device.status lags under its budget; the live API does not.
	testwait.For(t, 30*time.Second, func() error {
		got, err := readAll(alice)
		if err != nil {
			return err
		}
		var list v1alpha1.DeviceList
		if err := c.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		ahead := 0
		for _, d := range list.Items {
			var st int64 = -1
			for _, tw := range d.Status.Twins {
				if tw.PropertyName == "count" && tw.Reported != nil {
					st, _ = strconv.ParseInt(tw.Reported.Value, 10, 64)
				}
			}
			if v, _ := countOf(got[d.Name]); v > st {
				ahead++
			}
		}
		if ahead == 0 {
			return errors.New("no reading is newer than its Device's status")
		}
		t.Logf("%d of %d readings newer than Device.status", ahead, len(list.Items))
		return nil
	})
	// The Table kubectl prints.
	out, errOut, err := run(alice, "get", readingsv1.Resource, "-n", "default", "-o", "wide")
	if err != nil {
		t.Fatalf("kubectl get -o wide: %v: %s", err, errOut)
	}
	t.Logf("kubectl get devicereadings -o wide:\n%s", out)
	for _, want := range []string{"NAME", "VALUES", "REPLICA", "count=", devName(0, 0), f.replicas[1].name} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl's table lacks %q", want)
		}
	}
	out, errOut, err = run(alice, "get", readingsv1.ShortName, devName(1, 1), "-n", "default")
	if err != nil || !strings.Contains(out, devName(1, 1)) {
		t.Errorf("kubectl get dr %s: %v: %s%s", devName(1, 1), err, out, errOut)
	}

	// Refused: alice elsewhere, bob anywhere.
	for _, tc := range []struct{ who, kubeconfig, ns string }{{"alice", alice, "other"}, {"bob", bob, "default"}} {
		_, errOut, err := run(tc.kubeconfig, "get", readingsv1.Resource, "-n", tc.ns)
		if err == nil || !strings.Contains(strings.ToLower(errOut), "forbidden") {
			t.Errorf("%s listing readings in %s: %v: %s, want Forbidden", tc.who, tc.ns, err, errOut)
		}
	}
	// The replicas' own authorization: the front proxy's certificate
	// naming bob gets 403 from the replica (its SubjectAccessReview),
	// naming alice 200; no certificate, 401.
	certFile, keyFile := f.cp.FrontProxyClient()
	fp, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	for _, r := range f.replicas {
		for _, tc := range []struct {
			user string
			cert bool
			want int
		}{{"bob", true, http.StatusForbidden}, {"alice", true, http.StatusOK}, {"alice", false, http.StatusUnauthorized}} {
			conf := &tls.Config{RootCAs: pool, ServerName: readingsService + ".dowse-system.svc"}
			if tc.cert {
				conf.Certificates = []tls.Certificate{fp}
			}
			hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: conf}}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/apis/%s/%s/namespaces/default/%s", r.readings, readingsv1.Group, readingsv1.Version, readingsv1.Resource), nil)
			req.Header.Set("X-Remote-User", tc.user)
			req.Header.Set("X-Remote-Group", "system:authenticated")
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%s as %s (certificate %v): %d %s, want %d", r.name, tc.user, tc.cert, resp.StatusCode, body, tc.want)
			}
		}
	}

	// A watch: kubectl get -w as alice, its events decoded as they come.
	wctx, stopWatch := context.WithCancel(ctx)
	wcmd := exec.CommandContext(wctx, kubectl, "--kubeconfig", alice, "get", readingsv1.Resource, "-n", "default", "-w", "-o", "json", "--output-watch-events")
	wout, err := wcmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var wErr bytes.Buffer
	wcmd.Stderr = &wErr
	if err := wcmd.Start(); err != nil {
		t.Fatal(err)
	}
	type seenWatch struct {
		mu      sync.Mutex
		last    map[string]int64
		by      map[string]string // replica of the last event of each Device
		back    []string
		changes int
	}
	sw := &seenWatch{last: map[string]int64{}, by: map[string]string{}}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		dec := json.NewDecoder(bufio.NewReader(wout))
		for {
			var ev struct {
				Type   string                   `json:"type"`
				Object readingsv1.DeviceReading `json:"object"`
			}
			if err := dec.Decode(&ev); err != nil {
				return
			}
			v, _ := countOf(ev.Object)
			sw.mu.Lock()
			if last, ok := sw.last[ev.Object.Name]; ok && v < last {
				sw.back = append(sw.back, fmt.Sprintf("%s from %d to %d", ev.Object.Name, last, v))
			}
			sw.last[ev.Object.Name], sw.by[ev.Object.Name] = v, ev.Object.Replica
			sw.changes++
			sw.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		stopWatch()
		_ = wcmd.Wait()
		<-watched
	})
	// Caught up: every Device's event at least what was reported after the
	// watch began, from both replicas.
	waitWatch := func(what string, want map[string]int64, replicaOf func(holders map[string]string, name string) string) {
		t.Helper()
		testwait.For(t, time.Minute, func() error {
			holders, err := f.holders(ctx)
			if err != nil {
				return err
			}
			sw.mu.Lock()
			defer sw.mu.Unlock()
			for name, v := range want {
				if sw.last[name] < v {
					return fmt.Errorf("%s: the watch saw %s's count at %d, want at least %d (stderr: %s)", what, name, sw.last[name], v, wErr.String())
				}
				if r := replicaOf(holders, name); r != "" && sw.by[name] != r {
					return fmt.Errorf("%s: the watch saw %s from %q, want %q", what, name, sw.by[name], r)
				}
			}
			return nil
		})
	}
	time.Sleep(time.Second)
	nodeOf := func(name string) string { return strings.Join(strings.Split(name, "-")[:2], "-") }
	waitWatch("live", reported(), func(holders map[string]string, name string) string { return holders[nodeOf(name)] })

	// dowsectl twin watch reads the live values: every counter step of a
	// Device, not the few its status holds.
	twOut := procs.NewLines()
	tw, err := procs.Start("dowsectl", twOut, "twin", "watch", devName(2, 0), "-o", "json", "--kubeconfig", f.kubeconfig, "-n", "default")
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, func() error {
		if strings.Contains(twOut.String(), "is not served") {
			return fmt.Errorf("twin watch did not find the readings API: %s", twOut.String())
		}
		distinct := map[string]bool{}
		for _, l := range twOut.All() {
			var ch dowsectl.Change
			if json.Unmarshal([]byte(l), &ch) == nil && ch.Property == "count" && ch.Field == "reported" {
				distinct[ch.Value] = true
			}
		}
		if len(distinct) < 10 {
			return fmt.Errorf("twin watch printed %d values of count, want every step:\n%s", len(distinct), twOut.String())
		}
		return nil
	})
	tw.Stop()

	// kill -9 of replica 1: replica 0 takes its nodes and serves them.
	victim := f.replicas[1]
	victim.proc.Kill()
	testwait.For(t, 2*time.Minute, func() error {
		h, err := f.holders(ctx)
		if err != nil {
			return err
		}
		for _, e := range edges {
			if h[e.node] != front.name || !e.hub.Connected() {
				return fmt.Errorf("%s held by %q (connected %v), want %s", e.node, h[e.node], e.hub.Connected(), front.name)
			}
		}
		return nil
	})
	after := reported()
	waitWatch("after kill -9", after, func(map[string]string, string) string { return front.name })
	testwait.For(t, time.Minute, func() error {
		want := reported()
		got, err := readAll(alice)
		if err != nil {
			return err
		}
		for name, w := range want {
			v, src := countOf(got[name])
			if v < w || src != readingsv1.SourceLive || got[name].Replica != front.name {
				return fmt.Errorf("%s: count %d (%s, from %q), the edge had reported %d", name, v, src, got[name].Replica, w)
			}
		}
		return nil
	})
	sw.mu.Lock()
	defer sw.mu.Unlock()
	t.Logf("the watch saw %d changes", sw.changes)
	if len(sw.back) > 0 {
		t.Errorf("a counter went back in the watch %d times, first: %v", len(sw.back), sw.back[:min(5, len(sw.back))])
	}
}
