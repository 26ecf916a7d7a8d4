package handler_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

const wait = 5 * time.Second

// discoverFunc adapts a function to handler.Discoverer.
type discoverFunc func(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error

func (f discoverFunc) Discover(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
	return f(ctx, req, send)
}

// static sends devices with the given ids once and waits for the stream to
// end, as a handler whose devices never change does.
func static(ids ...string) handler.Discoverer {
	return discoverFunc(func(ctx context.Context, _ *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
		if err := send(devices(ids...)); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	})
}

func devices(ids ...string) []*discoveryv1.Device {
	devs := make([]*discoveryv1.Device, 0, len(ids))
	for _, id := range ids {
		devs = append(devs, &discoveryv1.Device{Id: id, Properties: map[string]string{"ID": id}})
	}
	return devs
}

// running is a Server started by start.
type running struct {
	*handler.Server
	cancel context.CancelFunc
	done   chan error
}

// start starts a Server for cfg, filling in what the test left out, and
// stops it when the test ends.
func start(t *testing.T, cfg handler.Config) *running {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "test-handler"
	}
	if cfg.Discoverer == nil {
		cfg.Discoverer = static("a")
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = testr.New(t)
	}
	srv, err := handler.NewServer(cfg)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	ctx, cancelCause := context.WithCancelCause(context.Background())
	// The cause is what signal.NotifyContext gives on SIGTERM: an ending
	// that Start must not report as its own failure.
	cancel := func() { cancelCause(errors.New("terminated signal received")) }
	r := &running{Server: srv, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(wait):
			t.Errorf("Start did not return within %v of its context ending", wait)
		}
	})
	// Tests dial the handler at once, as an agent does only once the
	// handler has registered, that is once it listens (or, in tests of
	// fatal errors, has already stopped).
	waitFor(t, "the handler to listen", func() bool {
		select {
		case err := <-r.done:
			r.done <- err
			return true
		default:
		}
		// The socket file appears at bind, a moment before listen: a dial
		// in between is refused (seen under load).
		c, err := net.Dial("unix", srv.Endpoint())
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return r
}

// result waits for Start to return and gives its error.
func (r *running) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(wait):
		t.Fatalf("Start did not return within %v", wait)
		return nil
	}
}

// waitFor polls cond until it holds, failing the test after wait.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, wait, func() error {
		if !cond() {
			return errors.New(what)
		}
		return nil
	})
}

func TestRegistersAndReregistersWhenAgentRestarts(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	// Once registered the handler has no reason to call the agent again, so
	// only noticing the new registration socket can bring the second
	// registration. The short retry covers the moment between the agent's
	// bind (which the handler notices) and its listen.
	srv := start(t, handler.Config{Name: "echo", Shared: true, StateDir: dir, Discoverer: static("a", "b"), RetryInitial: 50 * time.Millisecond, RetryMax: time.Minute})

	reg := agent.WaitForRegistration(t, wait)
	if reg.GetName() != "echo" || !reg.GetShared() || reg.GetEndpointType() != discoveryv1.RegisterDiscoveryHandlerRequest_UDS {
		t.Errorf("registration = %v, want name echo, shared, UDS", reg)
	}
	if reg.GetEndpoint() != srv.Endpoint() || !filepath.IsAbs(reg.GetEndpoint()) || filepath.Dir(reg.GetEndpoint()) != filepath.Join(dir, "discovery") {
		t.Errorf("endpoint = %q, want %q, an absolute path directly inside %s/discovery", reg.GetEndpoint(), srv.Endpoint(), dir)
	}
	if fi, err := os.Stat(reg.GetEndpoint()); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("handler socket: %v, %v; want mode 0660 (the handler's and agent's user and group only)", fi, err)
	}

	// The agent reaches the handler at the endpoint it registered.
	stream := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{})
	if got := handlertest.IDs(stream.Next(t, wait)); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("devices = %v, want [a b]", got)
	}

	// The agent restarts: its socket goes away and comes back.
	agent.Stop()
	agent2 := handlertest.StartAgent(t, dir)
	reg2 := agent2.WaitForRegistration(t, wait)
	if reg2.GetName() != "echo" || reg2.GetEndpoint() != srv.Endpoint() || !reg2.GetShared() {
		t.Errorf("re-registration = %v, want the same name, endpoint and shared", reg2)
	}
}

func TestRegistersWhenAgentStartsLater(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	srv := start(t, handler.Config{StateDir: dir, RetryInitial: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond})

	agent := handlertest.StartAgent(t, dir)
	if reg := agent.WaitForRegistration(t, wait); reg.GetEndpoint() != srv.Endpoint() {
		t.Errorf("endpoint = %q, want %q", reg.GetEndpoint(), srv.Endpoint())
	}
}

func TestRetriesWhileAgentUnavailable(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	var calls atomic.Int32
	agent.Reject(func(*discoveryv1.RegisterDiscoveryHandlerRequest) error {
		if calls.Add(1) <= 2 {
			return status.Error(codes.Unavailable, "agent shutting down")
		}
		return nil
	})
	start(t, handler.Config{StateDir: dir, RetryInitial: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond})

	agent.WaitForRegistration(t, wait)
	if n := calls.Load(); n != 3 {
		t.Errorf("registration calls = %d, want 3 (two refused, one accepted)", n)
	}
}

func TestRejectedRegistrationIsFatal(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	agent.Reject(func(*discoveryv1.RegisterDiscoveryHandlerRequest) error {
		return status.Error(codes.InvalidArgument, "endpoint outside the state directory")
	})
	srv := start(t, handler.Config{StateDir: dir})

	err := srv.result(t)
	if err == nil || !strings.Contains(err.Error(), "endpoint outside the state directory") {
		t.Errorf("Start = %v, want the agent's InvalidArgument", err)
	}
	if _, err := os.Stat(srv.Endpoint()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("handler socket still there after Start returned: %v", err)
	}
}

func TestReregistersWhenAgentClosesStream(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	srv := start(t, handler.Config{StateDir: dir, RetryInitial: time.Minute})
	agent.WaitForRegistration(t, wait)

	stream := handlertest.Discover(t, srv.Endpoint(), &discoveryv1.DiscoverRequest{})
	stream.Next(t, wait)
	stream.Close()
	agent.WaitForRegistration(t, wait)
}

func TestIdenticalListsAreSentOnce(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	changed := &discoveryv1.Device{Id: "a", Properties: map[string]string{"ID": "changed"}}
	lists := [][]*discoveryv1.Device{
		devices("a"),
		devices("a"),
		devices("a", "b"),
		devices("b", "a"), // same list, other order
		{devices("b")[0], changed},
		{changed, devices("b")[0]},
		{},
		nil,
		devices("c"),
	}
	disc := discoverFunc(func(ctx context.Context, _ *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
		for _, l := range lists {
			if err := send(l); err != nil {
				return err
			}
		}
		<-ctx.Done()
		return nil
	})
	srv := start(t, handler.Config{StateDir: dir, Discoverer: disc})
	stream := handlertest.Discover(t, srv.Endpoint(), &discoveryv1.DiscoverRequest{})

	// Each message must be the next distinct list, sorted by id; "c" comes
	// last, so a repeat sent before it would be caught here.
	want := [][]string{{"a"}, {"a", "b"}, {"a", "b"}, {}, {"c"}}
	for i, w := range want {
		devs := stream.Next(t, wait)
		if got := handlertest.IDs(devs); !slices.Equal(got, w) {
			t.Fatalf("message %d = %v, want %v", i, got, w)
		}
		if i == 2 && devs[0].GetProperties()["ID"] != "changed" {
			t.Errorf("message 2 carries %v, want the changed device a", devs[0])
		}
	}
}

func TestSendRejectsInvalidLists(t *testing.T) {
	for name, devs := range map[string][]*discoveryv1.Device{
		"empty id":    devices("a", ""),
		"repeated id": devices("a", "b", "a"),
		"nil device":  {nil},
	} {
		t.Run(name, func(t *testing.T) {
			dir := handlertest.ShortTempDir(t)
			disc := discoverFunc(func(ctx context.Context, _ *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
				return send(devs)
			})
			srv := start(t, handler.Config{StateDir: dir, Discoverer: disc})
			err := handlertest.Discover(t, srv.Endpoint(), &discoveryv1.DiscoverRequest{}).Err(t, wait)
			if status.Code(err) != codes.Internal {
				t.Errorf("stream error = %v, want Internal", err)
			}
		})
	}
}

func TestInvalidArgumentReachesAgent(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	disc := discoverFunc(func(ctx context.Context, req *discoveryv1.DiscoverRequest, _ func([]*discoveryv1.Device) error) error {
		return status.Errorf(codes.InvalidArgument, "discovery_details: descriptions[1] is empty (got %q)", req.GetDiscoveryDetails())
	})
	srv := start(t, handler.Config{StateDir: dir, Discoverer: disc})

	err := handlertest.Discover(t, srv.Endpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: "x"}).Err(t, wait)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "descriptions[1]") {
		t.Errorf("stream error = %v, want InvalidArgument naming descriptions[1]", err)
	}
}

func TestEarlyReturnIsInternal(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	disc := discoverFunc(func(context.Context, *discoveryv1.DiscoverRequest, func([]*discoveryv1.Device) error) error {
		return nil
	})
	srv := start(t, handler.Config{StateDir: dir, Discoverer: disc})

	err := handlertest.Discover(t, srv.Endpoint(), &discoveryv1.DiscoverRequest{}).Err(t, wait)
	if status.Code(err) != codes.Internal {
		t.Errorf("stream error = %v, want Internal", err)
	}
}

func TestShutdownEndsStreamsAndRemovesSocket(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	var ctxSeen sync.Once
	var hasLogger atomic.Bool
	disc := discoverFunc(func(ctx context.Context, _ *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
		ctxSeen.Do(func() {
			_, err := logr.FromContext(ctx)
			hasLogger.Store(err == nil)
		})
		if err := send(devices("a")); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	})
	srv := start(t, handler.Config{StateDir: dir, Discoverer: disc})
	stream := handlertest.Discover(t, srv.Endpoint(), &discoveryv1.DiscoverRequest{})
	stream.Next(t, wait)
	if !hasLogger.Load() {
		t.Error("the stream context carries no logger")
	}

	srv.cancel()
	if err := stream.Err(t, wait); status.Code(err) != codes.Unavailable {
		t.Errorf("stream error = %v, want Unavailable", err)
	}
	if err := srv.result(t); err != nil {
		t.Errorf("Start = %v, want nil", err)
	}
	if _, err := os.Stat(srv.Endpoint()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("handler socket still there after Start returned: %v", err)
	}
}

func TestReplacesStaleSocketFile(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	srv, err := handler.NewServer(handler.Config{Name: "stale", StateDir: dir, Discoverer: static("a"), Logger: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(srv.Endpoint(), []byte("left by a crashed handler"), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, handler.Config{Name: "stale", StateDir: dir})
	agent.WaitForRegistration(t, wait)
	handlertest.Discover(t, srv.Endpoint(), &discoveryv1.DiscoverRequest{}).Next(t, wait)
}

func TestRemovedSocketIsFatal(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	srv := start(t, handler.Config{StateDir: dir})
	agent.WaitForRegistration(t, wait)

	if err := os.Remove(srv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := srv.result(t); err == nil || !strings.Contains(err.Error(), "removed") {
		t.Errorf("Start = %v, want an error about the removed socket", err)
	}
}

func TestStartTwice(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	srv := start(t, handler.Config{StateDir: dir})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := srv.Start(ctx); err == nil || ctx.Err() != nil {
		t.Errorf("second Start = %v, want an immediate error", err)
	}
}

func TestNewServerValidates(t *testing.T) {
	ok := handler.Config{Name: "ok", StateDir: "/var/lib/dowse", Discoverer: static()}
	for name, tc := range map[string]struct {
		mutate  func(*handler.Config)
		wantErr string
	}{
		"valid":             {mutate: func(*handler.Config) {}},
		"relative dir":      {mutate: func(c *handler.Config) { c.StateDir = "state" }},
		"no name":           {mutate: func(c *handler.Config) { c.Name = "" }, wantErr: "DNS-1123"},
		"upper-case name":   {mutate: func(c *handler.Config) { c.Name = "Echo" }, wantErr: "DNS-1123"},
		"name with slash":   {mutate: func(c *handler.Config) { c.Name = "../echo" }, wantErr: "DNS-1123"},
		"trailing dash":     {mutate: func(c *handler.Config) { c.Name = "echo-" }, wantErr: "DNS-1123"},
		"too long name":     {mutate: func(c *handler.Config) { c.Name = strings.Repeat("a", 64) }, wantErr: "DNS-1123"},
		"no state dir":      {mutate: func(c *handler.Config) { c.StateDir = "" }, wantErr: "state directory"},
		"no discoverer":     {mutate: func(c *handler.Config) { c.Discoverer = nil }, wantErr: "discoverer"},
		"negative duration": {mutate: func(c *handler.Config) { c.RetryMax = -1 }, wantErr: "negative"},
		"socket too long":   {mutate: func(c *handler.Config) { c.StateDir = "/" + strings.Repeat("d", 100) }, wantErr: "longer than"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := ok
			tc.mutate(&cfg)
			srv, err := handler.NewServer(cfg)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("NewServer = %v, want no error", err)
				}
				if ep := srv.Endpoint(); !filepath.IsAbs(ep) || !strings.HasPrefix(filepath.Base(ep), cfg.Name+"-") || filepath.Ext(ep) != ".sock" {
					t.Errorf("endpoint = %q, want an absolute <dir>/%s-<pid>.sock", ep, cfg.Name)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("NewServer = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestStateDir(t *testing.T) {
	for name, tc := range map[string]struct {
		env, flag string
		akriEnv   string
		want      string
	}{
		"default":       {want: handler.DefaultStateDir},
		"env":           {env: "/from/env", want: "/from/env"},
		"akri env":      {akriEnv: "/from/akri", want: "/from/akri"},
		"env wins akri": {env: "/from/env", akriEnv: "/from/akri", want: "/from/env"},
		"flag wins":     {env: "/from/env", flag: "/from/flag", want: "/from/flag"},
		"flag, no env":  {flag: "/from/flag", want: "/from/flag"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(handler.StateDirEnv, tc.env)
			t.Setenv(handler.AkriStateDirEnv, tc.akriEnv)
			if got := handler.StateDirFromEnv(tc.flag); got != tc.want {
				t.Errorf("StateDirFromEnv(%q) = %q, want %q", tc.flag, got, tc.want)
			}

			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			dir := handler.StateDirFlag(fs)
			var args []string
			if tc.flag != "" {
				args = []string{"--state-dir", tc.flag}
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			if *dir != tc.want {
				t.Errorf("--state-dir resolved to %q, want %q", *dir, tc.want)
			}
		})
	}
}

// The Server counts streams, lists sent and dropped as unchanged, the
// devices of the newest list, registrations and failed streams, and serves
// them in the Prometheus text format on MetricsAddr.
func TestMetrics(t *testing.T) {
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	lists := make(chan []*discoveryv1.Device)
	d := discoverFunc(func(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
		if req.GetDiscoveryDetails() == "fail" {
			return status.Error(codes.InvalidArgument, "bad details")
		}
		for {
			select {
			case <-ctx.Done():
				return nil
			case l := <-lists:
				if err := send(l); err != nil {
					return err
				}
			}
		}
	})
	port := freePort(t)
	srv := start(t, handler.Config{Name: "counted", StateDir: dir, Discoverer: d, MetricsAddr: fmt.Sprintf("127.0.0.1:%d", port)})
	agent.WaitForRegistration(t, wait)
	stream := handlertest.Discover(t, srv.Endpoint(), &discoveryv1.DiscoverRequest{})
	lists <- devices("a", "b")
	stream.Next(t, wait)
	lists <- devices("b", "a") // the same list: not sent
	lists <- devices("c")
	stream.Next(t, wait)
	failed := handlertest.Discover(t, srv.Endpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: "fail"})
	if code := status.Code(failed.Err(t, wait)); code != codes.InvalidArgument {
		t.Fatalf("failing stream ended with %v", code)
	}

	want := []string{
		`dowse_handler_discover_streams_total{handler="counted"} 2`,
		`dowse_handler_discover_streams{handler="counted"} 1`,
		`dowse_handler_device_lists_sent_total{handler="counted"} 2`,
		`dowse_handler_device_lists_unchanged_total{handler="counted"} 1`,
		`dowse_handler_devices{handler="counted"} 1`,
		`dowse_handler_discover_errors_total{handler="counted",code="InvalidArgument"} 1`,
	}
	testwait.For(t, wait, func() error {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, w := range want {
			if !strings.Contains(string(b), w+"\n") {
				return fmt.Errorf("metrics lack %q:\n%s", w, b)
			}
		}
		// One registration, or two when the agent's socket is noticed
		// after the first.
		if !regexp.MustCompile(`(?m)^dowse_handler_registrations_total\{handler="counted"\} [12]$`).Match(b) {
			return fmt.Errorf("metrics lack the registrations:\n%s", b)
		}
		if !regexp.MustCompile(`(?m)^go_goroutines [1-9][0-9]*$`).Match(b) {
			return fmt.Errorf("metrics lack go_goroutines:\n%s", b)
		}
		return nil
	})
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
