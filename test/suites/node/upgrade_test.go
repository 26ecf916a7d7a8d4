package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/hack/images/imagearchive"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/peers/modbusplc"
)

// earlierCommit is the release an upgrade starts from and a rollback goes
// back to: its chart and its images, built from this commit of main
// (2026-12-07 01:57). It is the last before the Device CRD gained
// spec.stateReport (2d5d22b), so the upgrade has a CRD to bring up to date,
// and it is after the socket folders' group (0abc590) and the link CA made
// by the controller (92c9dfa), so its chart takes the values today's test
// node is given (nodeValues) and its mapper Pods need not be remade. Move it
// forward when a release is cut (to that release's commit), or when the
// test setup outgrows it.
const earlierCommit = "5104900"

// earlierTag tags the earlier release's images, beside :latest (this tree's).
const earlierTag = "earlier-" + earlierCommit

// earlierRelease exports earlierCommit with git archive into a temporary
// directory, builds the main packages of images there (Go's build cache
// makes a second run take seconds: -trimpath keeps the directory out of
// its keys) and writes their image archives tagged earlierTag. It returns
// the archives and the exported chart's directory.
func earlierRelease(t *testing.T, ctx context.Context, images [][2]string) (archives []string, chart string) {
	t.Helper()
	begin := time.Now()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("git -C %q archive %s | tar -x -C %q", kube.RepoRoot(), earlierCommit, src))
	if b, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("exporting %s with git archive: %v\n%s", earlierCommit, err, b)
	}
	bin := filepath.Join(dir, "bin")
	args := []string{"build", "-trimpath", "-ldflags=-s -w -X github.com/dowse-dev/dowse/internal/version.version=" + earlierCommit, "-o", bin + "/"}
	for _, im := range images {
		args = append(args, im[0])
	}
	build := exec.CommandContext(ctx, "go", args...)
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s's images: %v\n%s", earlierCommit, err, b)
	}
	for _, im := range images {
		name := filepath.Base(im[0])
		out := filepath.Join(dir, name+".tar")
		if err := imagearchive.Write(out, imagearchive.Image{Ref: im[1], Binary: filepath.Join(bin, name), Labels: imagearchive.Labels(name, earlierCommit)}); err != nil {
			t.Fatal(err)
		}
		archives = append(archives, out)
	}
	t.Logf("the earlier release (%s): %d images built in %v", earlierCommit, len(images), time.Since(begin).Round(100*time.Millisecond))
	return archives, filepath.Join(src, "deploy", "helm", "dowse")
}

// counterProperty is the PLC's counter (input register 1) as a property of
// the model, and read every 200 ms, as often as it goes up.
func counterProperty(model *v1alpha1.DeviceModel, cfg *v1alpha1.Configuration) {
	model.Spec.Properties = append(model.Spec.Properties, v1alpha1.ModelProperty{Name: "counter", Type: v1alpha1.PropertyInt, AccessMode: v1alpha1.ReadOnly,
		Visitors: &v1alpha1.VisitorConfig{ProtocolName: "modbus", ConfigData: &apiextensionsv1.JSON{Raw: []byte(`{"register":"input","address":1,"dataType":"uint16"}`)}}})
	var p v1alpha1.DeviceProperty
	if err := yaml.Unmarshal([]byte(`{name: counter, collectCycle: 200ms}`), &p); err != nil {
		panic(err)
	}
	cfg.Spec.DeviceTemplate.Properties = append(cfg.Spec.DeviceTemplate.Properties, p)
}

// counterWatch follows the Device's status through a watch and keeps each
// counter value it shows, with when it was seen; a value that goes back
// (or is not a number) is an error.
type counterWatch struct {
	mu      sync.Mutex
	samples []counterSample
	errs    []string
}

type counterSample struct {
	at time.Time
	v  int
}

func watchCounter(t *testing.T, cfg *rest.Config, opts client.Options) *counterWatch {
	t.Helper()
	wc, err := client.NewWithWatch(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	w := &counterWatch{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = kube.Watch(ctx, wc, &v1alpha1.DeviceList{}, "default", func(ev watch.EventType, o client.Object) {
			d, ok := o.(*v1alpha1.Device)
			if !ok || ev == watch.Deleted {
				return
			}
			rep := reported(d, "counter")
			if rep == "" {
				return
			}
			now := time.Now()
			w.mu.Lock()
			defer w.mu.Unlock()
			v, err := strconv.Atoi(rep)
			switch {
			case err != nil:
				w.errs = append(w.errs, fmt.Sprintf("counter reported %q", rep))
				return
			case len(w.samples) > 0 && v < w.samples[len(w.samples)-1].v:
				w.errs = append(w.errs, fmt.Sprintf("counter went back from %d to %d at %s", w.samples[len(w.samples)-1].v, v, now.Format(time.StampMilli)))
			}
			if len(w.samples) == 0 || v != w.samples[len(w.samples)-1].v {
				w.samples = append(w.samples, counterSample{now, v})
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// last is the newest value seen (-1: none).
func (w *counterWatch) last() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.samples) == 0 {
		return -1
	}
	return w.samples[len(w.samples)-1].v
}

// window says what the status showed between from and to: how many new
// counter values, how far the counter went, and the longest time the
// status showed no new value (from the last value before from), which
// began at gapAt.
func (w *counterWatch) window(from, to time.Time) (updates, advance int, gap time.Duration, gapAt time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	prev := from
	first, last := -1, -1
	for _, s := range w.samples {
		if s.at.Before(from) {
			prev, first = s.at, s.v
			continue
		}
		if s.at.After(to) {
			break
		}
		updates++
		if d := s.at.Sub(prev); d > gap {
			gap, gapAt = d, prev
		}
		prev, last = s.at, s.v
		if first < 0 {
			first = s.v
		}
	}
	if d := to.Sub(prev); d > gap {
		gap, gapAt = d, prev
	}
	if last >= 0 {
		advance = last - first
	}
	return updates, advance, gap, gapAt
}

// started says when each of Dowse's Pods in ns (by app.kubernetes.io/name)
// last started its first container, as an offset from begin.
func started(ctx context.Context, cl client.Client, ns string, begin time.Time) string {
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return err.Error()
	}
	var out []string
	for _, p := range pods.Items {
		if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
			continue
		}
		at := p.Status.ContainerStatuses[0].State.Running.StartedAt.Time
		out = append(out, fmt.Sprintf("%s +%v", p.Labels["app.kubernetes.io/name"], at.Sub(begin).Round(100*time.Millisecond)))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

func (w *counterWatch) errors() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.errs)
}

// counterCaughtUp holds the PLC's counter and waits until Device.status
// shows its value (nothing the mapper read is missing at the end), then
// lets it count again.
func counterCaughtUp(t *testing.T, ctx context.Context, w *counterWatch, plc *modbusplc.PLC, what string) {
	t.Helper()
	want := plc.HoldCounter(true)
	defer plc.HoldCounter(false)
	eventuallyNode(t, ctx, time.Minute, func() error {
		if got := w.last(); got != want {
			return fmt.Errorf("%s: Device.status shows counter %d, the PLC's is %d", what, got, want)
		}
		return nil
	})
}

func reported(d *v1alpha1.Device, prop string) string {
	rep, _ := d.Twin(prop).Values()
	return rep
}

// brokerPod is what a broker Pod holding a device is: its UID, its
// containers' restarts, the device's environment it serves, and its
// address on the pod network (empty on the node's network).
type brokerPod struct {
	uid      types.UID
	restarts int32
	device   map[string]string
	ip       string
}

// brokerPods waits until the Configuration's broker Pods (not mappers)
// are ready and each (on the node's network, or at its own address of the
// pod network, port port) serves the device environment it was given, and
// reads them.
func brokerPods(t *testing.T, ctx context.Context, cl client.Client, cfg string, port int32) map[string]brokerPod {
	t.Helper()
	var out map[string]brokerPod
	eventuallyNode(t, ctx, time.Minute, func() error {
		var err error
		out, err = readBrokerPods(ctx, cl, cfg, port)
		return err
	})
	return out
}

// readBrokerPods reads the Configuration's broker Pods (not mappers), or
// says which is not ready or serves no device environment (on the node's
// network, or at its own address of the pod network, port port).
func readBrokerPods(ctx context.Context, cl client.Client, cfg string, port int32) (map[string]brokerPod, error) {
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.MatchingLabels{v1alpha1.LabelConfiguration: cfg}); err != nil {
		return nil, err
	}
	out := map[string]brokerPod{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Labels[v1alpha1.LabelMapper] == "true" {
			continue
		}
		b := brokerPod{uid: p.UID}
		host := "127.0.0.1"
		if !p.Spec.HostNetwork {
			if p.Status.PodIP == "" {
				return nil, fmt.Errorf("broker Pod %s has no address yet", p.Name)
			}
			host, b.ip = p.Status.PodIP, p.Status.PodIP
		}
		for _, cs := range p.Status.ContainerStatuses {
			if !cs.Ready {
				return nil, fmt.Errorf("broker Pod %s: %s not ready", p.Name, cs.Name)
			}
			b.restarts += cs.RestartCount
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/", net.JoinHostPort(host, strconv.Itoa(int(port)))), nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("broker Pod %s: %w", p.Name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		var env struct {
			Device map[string]string `json:"device"`
		}
		if err := json.Unmarshal(body, &env); err != nil || len(env.Device) == 0 {
			return nil, fmt.Errorf("broker Pod %s serves no device environment (%w): %s", p.Name, err, body)
		}
		b.device = env.Device
		out[p.Namespace+"/"+p.Name] = b
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no broker Pod of %s", cfg)
	}
	return out, nil
}

// sameBrokers fails unless every broker Pod of before still runs, the same
// Pod with no restart, serving the same device environment.
func sameBrokers(t *testing.T, before, after map[string]brokerPod, what string) {
	t.Helper()
	for _, err := range diffBrokers(before, after, what) {
		t.Error(err)
	}
}

// diffBrokers says how the broker Pods after differ from before: each of
// before must still run, the same Pod with as many restarts, serving the
// same device environment.
func diffBrokers(before, after map[string]brokerPod, what string) []error {
	var errs []error
	for n, b := range before {
		a, ok := after[n]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s: broker Pod %s is gone", what, n))
		case a.uid != b.uid:
			errs = append(errs, fmt.Errorf("%s: broker Pod %s is another Pod (%s, was %s)", what, n, a.uid, b.uid))
		case a.restarts != b.restarts:
			errs = append(errs, fmt.Errorf("%s: broker Pod %s has %d restarts, want %d", what, n, a.restarts, b.restarts))
		default:
			for k, v := range b.device {
				if a.device[k] != v {
					errs = append(errs, fmt.Errorf("%s: broker Pod %s serves %s=%q, was %q", what, n, k, a.device[k], v))
				}
			}
		}
	}
	return errs
}

// nodeDevices is what the node holds for Dowse's devices: its allocatable
// dowse.dev/ resources and each CDI device the agent wrote into dir
// (kind=name) with its env.
type nodeDevices struct {
	allocatable map[string]string
	cdi         map[string]string
}

func readNodeDevices(ctx context.Context, cl client.Client, dir string) (nodeDevices, error) {
	nd := nodeDevices{allocatable: map[string]string{}, cdi: map[string]string{}}
	var nodes corev1.NodeList
	if err := cl.List(ctx, &nodes); err != nil {
		return nd, err
	}
	for _, n := range nodes.Items {
		for r, q := range n.Status.Allocatable {
			if strings.HasPrefix(string(r), v1alpha1.GroupVersion.Group+"/") {
				nd.allocatable[n.Name+" "+string(r)] = q.String()
			}
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nd, err
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nd, err
		}
		var spec struct {
			Kind    string `json:"kind"`
			Devices []struct {
				Name           string `json:"name"`
				ContainerEdits struct {
					Env []string `json:"env"`
				} `json:"containerEdits"`
			} `json:"devices"`
		}
		if err := json.Unmarshal(raw, &spec); err != nil {
			return nd, fmt.Errorf("CDI spec %s: %w", f, err)
		}
		for _, d := range spec.Devices {
			nd.cdi[spec.Kind+"="+d.Name] = strings.Join(d.ContainerEdits.Env, " ")
		}
	}
	if len(nd.allocatable) == 0 || len(nd.cdi) == 0 {
		return nd, fmt.Errorf("the node holds no device: %+v", nd)
	}
	return nd, nil
}

// sameNodeDevices waits until the node again holds every device of
// before: the same allocatable count of each resource, each CDI device with
// the same env.
func sameNodeDevices(t *testing.T, ctx context.Context, cl client.Client, dir string, before nodeDevices, what string) {
	t.Helper()
	eventuallyNode(t, ctx, time.Minute, func() error { return nodeDevicesAsBefore(ctx, cl, dir, before, what) })
}

// nodeDevicesAsBefore says what the node lacks of before's devices (nil:
// nothing).
func nodeDevicesAsBefore(ctx context.Context, cl client.Client, dir string, before nodeDevices, what string) error {
	now, err := readNodeDevices(ctx, cl, dir)
	if err != nil {
		return err
	}
	for r, q := range before.allocatable {
		if now.allocatable[r] != q {
			return fmt.Errorf("%s: node allocatable %s is %q, was %s", what, r, now.allocatable[r], q)
		}
	}
	for d, env := range before.cdi {
		if got, ok := now.cdi[d]; !ok || got != env {
			return fmt.Errorf("%s: CDI device %s has env %q (present %v), was %q", what, d, got, ok, env)
		}
	}
	return nil
}

// crdsServed fails unless every CRD of the chart at chart is served as the
// chart has it (each version's schema, served and storage flags) and every
// stored object of each kind reads back.
func crdsServed(t *testing.T, ctx context.Context, cl client.Client, chart, what string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chart, "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s: %v", chart, err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var want apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		var got apiextensionsv1.CustomResourceDefinition
		if err := cl.Get(ctx, client.ObjectKey{Name: want.Name}, &got); err != nil {
			t.Fatal(err)
		}
		if len(got.Spec.Versions) != len(want.Spec.Versions) {
			t.Errorf("%s: CRD %s has %d versions, the chart %d", what, want.Name, len(got.Spec.Versions), len(want.Spec.Versions))
			continue
		}
		for i, v := range want.Spec.Versions {
			g := got.Spec.Versions[i]
			ws, _ := json.Marshal(v.Schema)
			gs, _ := json.Marshal(g.Schema)
			if g.Name != v.Name || g.Served != v.Served || g.Storage != v.Storage || string(ws) != string(gs) {
				t.Errorf("%s: CRD %s version %s is not served as the chart has it (served %v storage %v, schema equal %v)", what, want.Name, v.Name, g.Served, g.Storage, string(ws) == string(gs))
			}
		}
	}
	for _, l := range []client.ObjectList{&v1alpha1.ConfigurationList{}, &v1alpha1.InstanceList{}, &v1alpha1.DeviceModelList{}, &v1alpha1.DeviceList{}} {
		if err := cl.List(ctx, l); err != nil {
			t.Errorf("%s: stored objects do not read back: %v", what, err)
		}
	}
}
