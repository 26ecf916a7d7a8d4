package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// DefaultDir is the kubelet's device-plugin directory.
const DefaultDir = dp.DevicePluginPath

// Host is the lifecycle of many device plugins: each is served on a socket
// of its own in the kubelet's device-plugin directory (the kubelet dials
// each resource's endpoint, and its calls do not name the resource), all
// from one gRPC server that tells them apart by the socket a connection
// came in on; each is registered with the kubelet, and served and
// registered again whenever the kubelet restarts (its socket is created
// anew) or the plugin's socket disappears. One directory watch and one
// queue of registrations serve every plugin: a plugin costs a socket and
// the kubelet's connection, no goroutine, timer or gRPC server of its own
// (thousands of Instances are thousands of plugins). It knows nothing of
// what a plugin's service offers.
type Host struct {
	dir string
	log logr.Logger
	// OnRegistered, if set, is called after each successful registration.
	OnRegistered func()
	srv          *grpc.Server
	wake         chan struct{}

	mu      sync.Mutex
	plugins map[string]*hosted // by socket path
	// queue holds the plugins to register, in order; queued marks them.
	queue []*hosted
}

// hosted is one plugin: its service on its socket.
type hosted struct {
	resource string
	sock     string
	svc      *service
	lis      net.Listener
	conns    map[net.Conn]struct{}
	queued   bool
	// registering: a worker has it; again: queue it once that ends (one
	// registration in flight at a time, or two could reach one kubelet).
	registering, again bool
	// kubelet names the kubelet registered with by its socket's inode: a
	// kubelet refuses a second registration of a connected endpoint and,
	// in refusing it, forgets the live connection (it then never notices
	// the plugin go away), so a plugin registers exactly once per kubelet,
	// however many events announce it.
	kubelet uint64
	removed bool
}

// retryEvery is the first wait after a failed registration or serve; it
// doubles up to retryMax.
const (
	retryEvery = time.Second
	retryMax   = 30 * time.Second
	// registerWorkers bound the registrations in flight: each is a round
	// trip in which the kubelet dials the plugin back.
	registerWorkers = 4
)

// NewHost makes a Host of the plugins in dir, the kubelet's device-plugin
// directory.
func NewHost(dir string, log logr.Logger) *Host {
	h := &Host{dir: dir, log: log, wake: make(chan struct{}, 1), plugins: map[string]*hosted{}}
	// Device-plugin traffic is a few small messages: no per-connection
	// read or write buffers (32 KiB each by default, a connection per
	// plugin).
	h.srv = grpc.NewServer(grpc.ReadBufferSize(0), grpc.WriteBufferSize(0))
	dp.RegisterDevicePluginServer(h.srv, router{h: h})
	return h
}

// Add serves svc for resource on the socket endpoint (a file name in the
// directory) and queues its registration. It returns the function that
// stops the plugin: its connections end (so the kubelet sees the resource
// go), its socket is removed.
func (h *Host) Add(resource, endpoint string, svc *service) (remove func()) {
	p := &hosted{resource: resource, sock: filepath.Join(h.dir, endpoint), svc: svc, conns: map[net.Conn]struct{}{}}
	h.mu.Lock()
	if old := h.plugins[p.sock]; old != nil {
		h.stopLocked(old)
	}
	h.plugins[p.sock] = p
	if err := h.serveLocked(p); err != nil {
		h.log.Error(err, "serving device plugin; will retry", "resource", resource)
	}
	h.enqueueLocked(p)
	h.mu.Unlock()
	h.wakeDispatcher()
	return sync.OnceFunc(func() {
		h.mu.Lock()
		if h.plugins[p.sock] == p {
			delete(h.plugins, p.sock)
		}
		h.stopLocked(p)
		h.mu.Unlock()
	})
}

// wakeDispatcher makes the serving loop look at its queue again; it never
// blocks: one pending wake-up covers any number of changes.
func (h *Host) wakeDispatcher() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// serveLocked listens on p's socket and serves it. Called with h.mu held.
func (h *Host) serveLocked(p *hosted) error {
	if err := os.Remove(p.sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	l, err := net.Listen("unix", p.sock)
	if err != nil {
		return err
	}
	// Closing a listener unlinks its path by default, even when the path
	// is by then a newer socket of ours: the socket is removed by hand.
	if ul, ok := l.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	p.lis = &trackingListener{Listener: l, host: h, p: p}
	go func() { _ = h.srv.Serve(p.lis) }()
	return nil
}

// dropLocked stops serving p without touching its socket path, which may
// already be someone else's. Called with h.mu held.
func (h *Host) dropLocked(p *hosted) {
	if p.lis != nil {
		_ = p.lis.Close()
		p.lis = nil
	}
	for c := range p.conns {
		// Closed here, under h.mu: its own Close would take h.mu again.
		if tc, ok := c.(*trackedConn); ok {
			tc.once.Do(func() {})
			_ = tc.Conn.Close()
		}
	}
	clear(p.conns)
}

// stopLocked ends p for good. Called with h.mu held.
func (h *Host) stopLocked(p *hosted) {
	if p.removed {
		return
	}
	p.removed = true
	h.dropLocked(p)
	close(p.svc.stop)
	_ = os.Remove(p.sock)
}

func (h *Host) enqueueLocked(p *hosted) {
	if p.registering {
		p.again = true
		return
	}
	if !p.queued {
		p.queued = true
		h.queue = append(h.queue, p)
	}
}

// Start watches the directory and registers the plugins until ctx ends,
// then stops them all and removes their sockets. The directory is created
// when missing, so that a kubelet starting after the agent is noticed.
// Registration failures (no kubelet yet) are retried with backoff, never
// fatal.
func (h *Host) Start(ctx context.Context) error {
	if err := os.MkdirAll(h.dir, 0o755); err != nil {
		return err
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", h.dir, err)
	}
	defer fw.Close()
	if err := fw.Add(h.dir); err != nil {
		return fmt.Errorf("watching %s: %w", h.dir, err)
	}
	defer func() {
		h.mu.Lock()
		for _, p := range h.plugins {
			h.stopLocked(p)
		}
		h.mu.Unlock()
		h.srv.Stop()
	}()
	kubeletSock := filepath.Join(h.dir, filepath.Base(dp.KubeletSocket))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		p  *hosted
		ok bool
	}
	work := make(chan *hosted)
	results := make(chan result, registerWorkers)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(work)
	for range registerWorkers {
		wg.Go(func() {
			for p := range work {
				ok := h.register(ctx, kubeletSock, p)
				select {
				case results <- result{p, ok}:
				case <-ctx.Done():
				}
			}
		})
	}
	// After a failure nothing is handed out until retry fires: without a
	// kubelet, one attempt per backoff, not one per plugin.
	backoff, busy := time.Duration(0), 0
	var retry <-chan time.Time
	for {
		for retry == nil && busy < registerWorkers {
			p, ok := h.next()
			if !ok {
				break
			}
			busy++
			select {
			case work <- p:
			case <-ctx.Done():
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-h.wake:
		case r := <-results:
			busy--
			h.mu.Lock()
			r.p.registering = false
			if r.p.again || !r.ok {
				r.p.again = false
				if !r.p.removed {
					h.enqueueLocked(r.p)
				}
			}
			h.mu.Unlock()
			if r.ok {
				backoff = 0
				continue
			}
			if retry == nil {
				backoff = min(max(2*backoff, retryEvery), retryMax)
				retry = time.After(backoff)
			}
		case <-retry:
			retry = nil
		case err := <-fw.Errors:
			h.log.Error(err, "watching the device-plugin directory")
		case ev := <-fw.Events:
			if h.event(ev, kubeletSock) {
				// A new kubelet, or a socket to serve again: now.
				backoff, retry = 0, nil
			}
		}
	}
}

// next takes the next queued plugin to register, serving its socket again
// when it was dropped; false when none is queued.
func (h *Host) next() (*hosted, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for len(h.queue) > 0 {
		p := h.queue[0]
		h.queue = h.queue[1:]
		p.queued = false
		if p.removed {
			continue
		}
		p.registering = true
		if p.lis == nil && h.reserveLocked(p) != nil {
			// Registered, it would be dialled on a socket not served.
			p.kubelet = 0
		}
		return p, true
	}
	return nil, false
}

// reserveLocked serves p again. Called with h.mu held.
func (h *Host) reserveLocked(p *hosted) error {
	err := h.serveLocked(p)
	if err != nil {
		h.log.Error(err, "serving device plugin; will retry", "resource", p.resource)
	}
	return err
}

// event handles a create or remove in the directory and says whether the
// kubelet restarted.
func (h *Host) event(ev fsnotify.Event, kubeletSock string) bool {
	switch {
	case ev.Name == kubeletSock && ev.Has(fsnotify.Create):
		ino := inode(kubeletSock)
		h.mu.Lock()
		n := 0
		for _, p := range h.plugins {
			if _, err := os.Stat(p.sock); err != nil {
				// The restarting kubelet removed our socket.
				h.dropLocked(p)
				p.kubelet = 0
			}
			if p.kubelet != ino || p.kubelet == 0 {
				p.kubelet = 0
				h.enqueueLocked(p)
				n++
			}
		}
		h.mu.Unlock()
		if n > 0 {
			h.log.Info("kubelet restarted; registering again", "plugins", n)
		}
		return true
	case ev.Has(fsnotify.Remove):
		h.mu.Lock()
		defer h.mu.Unlock()
		p := h.plugins[ev.Name]
		if p == nil || p.lis == nil {
			return false
		}
		// Our own stops and restarts also remove the socket: only a
		// socket that is missing now means someone else removed it.
		if _, err := os.Stat(p.sock); err == nil {
			return false
		}
		h.log.Info("plugin socket removed; serving again", "resource", p.resource)
		h.dropLocked(p)
		p.kubelet = 0
		h.enqueueLocked(p)
		return true
	}
	return false
}

// register registers p with the kubelet unless the kubelet it last
// registered with still runs, and reports whether p is registered.
func (h *Host) register(ctx context.Context, kubeletSock string, p *hosted) bool {
	h.mu.Lock()
	done := p.removed || (p.kubelet != 0 && p.kubelet == inode(kubeletSock))
	served := p.lis != nil
	resource, endpoint := p.resource, filepath.Base(p.sock)
	h.mu.Unlock()
	if done {
		return true
	}
	if !served {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	_, err = dp.NewRegistrationClient(conn).Register(rctx, &dp.RegisterRequest{
		Version: dp.Version, Endpoint: endpoint, ResourceName: resource, Options: &dp.DevicePluginOptions{},
	})
	if err != nil {
		h.log.V(1).Info("registering with the kubelet failed; will retry", "resource", resource, "err", err)
		return false
	}
	// The socket's inode after the registration, not before: a kubelet
	// restarting meanwhile (the old one already gone, so the registration
	// reached the new one) would otherwise look like a further restart to
	// come, and be registered with twice.
	h.mu.Lock()
	p.kubelet = inode(kubeletSock)
	h.mu.Unlock()
	h.log.V(1).Info("registered with the kubelet", "resource", resource)
	if h.OnRegistered != nil {
		h.OnRegistered()
	}
	return true
}

// inode identifies the file at path (0 when missing).
func inode(path string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}

// trackingListener records the connections a plugin's socket accepted, so
// that stopping the plugin ends them (one gRPC server serves every
// plugin: stopping it is not the way).
type trackingListener struct {
	net.Listener
	host *Host
	p    *hosted
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.host.mu.Lock()
	defer l.host.mu.Unlock()
	if l.p.lis != l {
		_ = c.Close()
		return nil, errors.New("plugin no longer served")
	}
	tc := &trackedConn{Conn: c, host: l.host, p: l.p}
	l.p.conns[tc] = struct{}{}
	return tc, nil
}

type trackedConn struct {
	net.Conn
	host *Host
	p    *hosted
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.host.mu.Lock()
		delete(c.p.conns, c)
		c.host.mu.Unlock()
	})
	return c.Conn.Close()
}

// router sends each call to the service of the socket it came in on.
type router struct {
	dp.UnimplementedDevicePluginServer
	h *Host
}

func (r router) service(ctx context.Context) (*service, error) {
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.LocalAddr == nil {
		return nil, status.Error(codes.Internal, "no local address for the call")
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if p := r.h.plugins[pr.LocalAddr.String()]; p != nil && !p.removed {
		return p.svc, nil
	}
	return nil, status.Errorf(codes.Unavailable, "no device plugin on %s", pr.LocalAddr)
}

func (r router) GetDevicePluginOptions(ctx context.Context, e *dp.Empty) (*dp.DevicePluginOptions, error) {
	s, err := r.service(ctx)
	if err != nil {
		return nil, err
	}
	return s.GetDevicePluginOptions(ctx, e)
}

func (r router) ListAndWatch(e *dp.Empty, stream grpc.ServerStreamingServer[dp.ListAndWatchResponse]) error {
	s, err := r.service(stream.Context())
	if err != nil {
		return err
	}
	return s.ListAndWatch(e, stream)
}

func (r router) GetPreferredAllocation(ctx context.Context, req *dp.PreferredAllocationRequest) (*dp.PreferredAllocationResponse, error) {
	s, err := r.service(ctx)
	if err != nil {
		return nil, err
	}
	return s.GetPreferredAllocation(ctx, req)
}

func (r router) Allocate(ctx context.Context, req *dp.AllocateRequest) (*dp.AllocateResponse, error) {
	s, err := r.service(ctx)
	if err != nil {
		return nil, err
	}
	return s.Allocate(ctx, req)
}

func (r router) PreStartContainer(ctx context.Context, req *dp.PreStartContainerRequest) (*dp.PreStartContainerResponse, error) {
	s, err := r.service(ctx)
	if err != nil {
		return nil, err
	}
	return s.PreStartContainer(ctx, req)
}
