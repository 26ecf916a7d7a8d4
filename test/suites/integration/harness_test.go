package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// stateDir makes a short temp dir: Unix socket paths must stay under 108 bytes.
func stateDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "dowse")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// requestCounter counts an agent's API requests, so tests can assert that a
// steady state costs no writes. Events are not counted: the controller
// sends them asynchronously, a moment after the write they report.
type requestCounter struct {
	writes, reads, watches atomic.Int64
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		switch {
		case strings.Contains(r.URL.Path, "/events"):
		case r.Method != http.MethodGet:
			c.writes.Add(1)
		case r.URL.Query().Get("watch") == "true":
			c.watches.Add(1)
		default:
			c.reads.Add(1)
		}
		return rt.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type runningAgent struct {
	node     string
	stateDir string
	requests *requestCounter
	cancel   context.CancelFunc
	done     chan error
}

type agentOption func(*agent.Config)

func withGrace(d time.Duration) agentOption { return func(c *agent.Config) { c.GracePeriod = d } }
func withMaxDevices(n int) agentOption      { return func(c *agent.Config) { c.MaxDevices = n } }

// agentConfigs holds each node's agent credentials, minted once.
var agentConfigs sync.Map // node name -> *rest.Config

// agentConfig is node's agent's rest.Config: the token of the agent
// DaemonSet's pod on node, under deploy/agent's RBAC and admission policy,
// as in a cluster, not admin's.
func agentConfig(t *testing.T, node string) *rest.Config {
	t.Helper()
	if cfg, ok := agentConfigs.Load(node); ok {
		return rest.CopyConfig(cfg.(*rest.Config))
	}
	cfg, err := kube.AgentConfig(context.Background(), suite.Config, node)
	if err != nil {
		t.Fatal(err)
	}
	agentConfigs.Store(node, cfg)
	return rest.CopyConfig(cfg)
}

// startAgent runs the real agent in-process against the test API server,
// with its node's agent credentials.
func startAgent(t *testing.T, node, dir string, opts ...agentOption) *runningAgent {
	t.Helper()
	counter := &requestCounter{}
	restCfg := agentConfig(t, node)
	restCfg.WrapTransport = counter.wrap
	cfg := agent.Config{
		SkipNameValidation: true,
		RESTConfig:         restCfg, NodeName: node, StateDir: dir,
		Serving:    kubeflags.Off(),
		Registerer: prometheus.NewRegistry(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &runningAgent{node: node, stateDir: dir, requests: counter, cancel: cancel, done: make(chan error, 1)}
	go func() {
		a.done <- agent.Run(ctx, cfg, testr.NewWithOptions(t, testr.Options{Verbosity: 0}).WithName(node))
	}()
	t.Cleanup(a.stop)
	// Ready when the registration socket exists.
	testwait.For(t, 30*time.Second, func() error {
		select {
		case err := <-a.done:
			t.Fatalf("agent %s exited: %v", node, err)
		default:
		}
		_, err := os.Stat(filepath.Join(dir, "discovery", "registration.sock"))
		return err
	})
	return a
}

func (a *runningAgent) stop() {
	if a.cancel == nil {
		return
	}
	a.cancel()
	a.cancel = nil
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		panic("agent did not stop within 30s")
	}
}

// scriptedHandler is a discovery handler whose device lists the test
// dictates, speaking the raw protocol: it can lie (duplicate or empty ids,
// floods) in ways the SDK would not let a real handler.
type scriptedHandler struct {
	discoveryv1.UnimplementedDiscoveryHandlerServer
	name, endpoint string
	shared         bool
	srv            *grpc.Server

	mu       sync.Mutex
	devices  []*discoveryv1.Device
	streams  map[chan []*discoveryv1.Device]struct{}
	requests []*discoveryv1.DiscoverRequest
	reject   error
}

func startScripted(t *testing.T, dir, name string, shared bool, devices []*discoveryv1.Device) *scriptedHandler {
	t.Helper()
	h := &scriptedHandler{name: name, shared: shared, devices: devices, streams: map[chan []*discoveryv1.Device]struct{}{},
		endpoint: filepath.Join(dir, fmt.Sprintf("%s-%d.sock", name, time.Now().UnixNano()%1e6))}
	lis, err := net.Listen("unix", h.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = grpc.NewServer()
	discoveryv1.RegisterDiscoveryHandlerServer(h.srv, h)
	go func() { _ = h.srv.Serve(lis) }()
	t.Cleanup(h.kill)
	h.register(t, dir)
	return h
}

func (h *scriptedHandler) register(t *testing.T, dir string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "discovery", "registration.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testwait.For(t, 10*time.Second, func() error {
		_, err := discoveryv1.NewRegistrationClient(conn).RegisterDiscoveryHandler(context.Background(), &discoveryv1.RegisterDiscoveryHandlerRequest{
			Name: h.name, Endpoint: h.endpoint, Shared: h.shared,
		})
		return err
	})
}

func (h *scriptedHandler) kill() { h.srv.Stop() }

func (h *scriptedHandler) set(devices []*discoveryv1.Device) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.devices = devices
	for ch := range h.streams {
		select {
		case <-ch:
		default:
		}
		ch <- devices
	}
}

// lastRequestWith is the newest request carrying discovery property name.
// The agent sees every test's Configurations, so a handler named like
// another test's gets their requests too; a property tells its own apart.
func (h *scriptedHandler) lastRequestWith(name string) *discoveryv1.DiscoverRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.requests) - 1; i >= 0; i-- {
		if _, ok := h.requests[i].GetDiscoveryProperties()[name]; ok {
			return h.requests[i]
		}
	}
	return nil
}

func (h *scriptedHandler) Discover(req *discoveryv1.DiscoverRequest, stream grpc.ServerStreamingServer[discoveryv1.DiscoverResponse]) error {
	ch := make(chan []*discoveryv1.Device, 1)
	h.mu.Lock()
	h.requests = append(h.requests, req)
	if h.reject != nil {
		h.mu.Unlock()
		return h.reject
	}
	ch <- h.devices
	h.streams[ch] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.streams, ch)
		h.mu.Unlock()
	}()
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case devs := <-ch:
			if err := stream.Send(&discoveryv1.DiscoverResponse{Devices: devs}); err != nil {
				return err
			}
		}
	}
}

func devices(ids ...string) []*discoveryv1.Device {
	out := make([]*discoveryv1.Device, 0, len(ids))
	for _, id := range ids {
		out = append(out, &discoveryv1.Device{Id: id, Properties: map[string]string{"ID": id}})
	}
	return out
}

func createConfiguration(t *testing.T, ns, name, handler string, details string, mutate ...func(*v1alpha1.Configuration)) *v1alpha1.Configuration {
	t.Helper()
	cfg := &v1alpha1.Configuration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.ConfigurationSpec{
			DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{Name: handler},
		},
	}
	if details != "" {
		cfg.Spec.DiscoveryHandler.DiscoveryDetails = &apiextensionsv1.JSON{Raw: []byte(details)}
	}
	for _, m := range mutate {
		m(cfg)
	}
	if err := suite.Client.Create(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	// Agents serve every namespace's Configurations: one left behind would
	// reach the next tests' agents and handlers of the same name. Cleanups
	// run in reverse, so the test's agent (started before) still runs and
	// lets go of its finalizer; one started after has stopped, and its
	// finalizer is removed here.
	t.Cleanup(func() { deleteConfiguration(t, cfg) })
	return cfg
}

func deleteConfiguration(t *testing.T, cfg *v1alpha1.Configuration) {
	ctx := context.Background()
	if err := suite.Client.Delete(ctx, cfg); client.IgnoreNotFound(err) != nil {
		t.Errorf("deleting Configuration %s/%s: %v", cfg.Namespace, cfg.Name, err)
		return
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var cur v1alpha1.Configuration
		err := suite.Client.Get(ctx, client.ObjectKeyFromObject(cfg), &cur)
		if apierrors.IsNotFound(err) {
			return
		}
		if err == nil && time.Now().After(deadline) && len(cur.Finalizers) > 0 {
			cur.Finalizers = nil
			err = suite.Client.Update(ctx, &cur)
		}
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			t.Errorf("deleting Configuration %s/%s: %v", cfg.Namespace, cfg.Name, err)
			return
		}
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Errorf("Configuration %s/%s still there", cfg.Namespace, cfg.Name)
			return
		}
	}
}

// instanceView is an Instance reduced to what tests compare.
type instanceView struct {
	Name, DeviceID string
	Nodes          []string
}

func listInstances(t *testing.T, ns, cfg string) []instanceView {
	t.Helper()
	var list v1alpha1.InstanceList
	if err := suite.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []instanceView
	for _, i := range list.Items {
		if i.Spec.ConfigurationName != cfg {
			continue
		}
		v := instanceView{Name: i.Name, DeviceID: i.Spec.DeviceID}
		for _, n := range i.Status.Nodes {
			v.Nodes = append(v.Nodes, n.Name)
		}
		sort.Strings(v.Nodes)
		out = append(out, v)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].DeviceID+out[a].Name < out[b].DeviceID+out[b].Name })
	return out
}

// consistently checks that f stays nil for d.
func consistently(t *testing.T, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := f(); err != nil {
			t.Fatalf("condition broke: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var errPending = errors.New("pending")

func nodeStatus(t *testing.T, ns, name, node string) *v1alpha1.ConfigurationNodeStatus {
	t.Helper()
	var cfg v1alpha1.Configuration
	if err := suite.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &cfg); err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Status.Nodes {
		if cfg.Status.Nodes[i].NodeName == node {
			return &cfg.Status.Nodes[i]
		}
	}
	return nil
}

func keyOf(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }

// expectCount waits until cfg has n Instances.
func expectCount(t *testing.T, ns, cfg string, n int, timeout time.Duration) {
	t.Helper()
	testwait.For(t, timeout, func() error {
		if got := len(listInstances(t, ns, cfg)); got != n {
			return fmt.Errorf("%s: %d instances, want %d", cfg, got, n)
		}
		return nil
	})
}
