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
	"google.golang.org/grpc/credentials/insecure"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// DefaultDir is the kubelet's device-plugin directory.
const DefaultDir = dp.DevicePluginPath

// KubeletWatcher tells subscribers when the kubelet's registration socket is
// created (the kubelet started or restarted) or a file in the plugin
// directory is removed (the kubelet removes every plugin socket when it
// starts). One watcher serves every plugin: inotify instances are scarce.
type KubeletWatcher struct {
	dir string
	log logr.Logger

	mu   sync.Mutex
	subs map[chan fsnotify.Event]struct{}
}

// NewKubeletWatcher watches dir, the kubelet's device-plugin directory.
func NewKubeletWatcher(dir string, log logr.Logger) *KubeletWatcher {
	return &KubeletWatcher{dir: dir, log: log, subs: map[chan fsnotify.Event]struct{}{}}
}

// Subscribe returns a channel of the directory's create and remove events
// (dropped when the subscriber is behind: only the latest matters) and a
// function that ends the subscription.
func (w *KubeletWatcher) Subscribe() (<-chan fsnotify.Event, func()) {
	ch := make(chan fsnotify.Event, 8)
	w.mu.Lock()
	w.subs[ch] = struct{}{}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		delete(w.subs, ch)
		w.mu.Unlock()
	}
}

// Start watches until ctx ends. The directory must exist (the kubelet makes
// it); Start creates it otherwise so that a kubelet starting after the agent
// is still noticed.
func (w *KubeletWatcher) Start(ctx context.Context) error {
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		return err
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", w.dir, err)
	}
	defer fw.Close()
	if err := fw.Add(w.dir); err != nil {
		return fmt.Errorf("watching %s: %w", w.dir, err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-fw.Errors:
			w.log.Error(err, "watching the device-plugin directory")
		case ev := <-fw.Events:
			if !ev.Has(fsnotify.Create) && !ev.Has(fsnotify.Remove) {
				continue
			}
			w.mu.Lock()
			for ch := range w.subs {
				select {
				case ch <- ev:
				default:
				}
			}
			w.mu.Unlock()
		}
	}
}

// Plugin is the lifecycle of one device plugin: it serves Service on a
// socket in Dir, registers ResourceName with the kubelet, and serves and
// registers again whenever the kubelet restarts (its socket is created
// anew) or the plugin's socket disappears. It knows nothing of what the
// service offers.
type Plugin struct {
	ResourceName string
	// Dir is the kubelet's device-plugin directory (DefaultDir).
	Dir string
	// Endpoint is the socket's file name in Dir.
	Endpoint string
	Service  dp.DevicePluginServer
	Options  *dp.DevicePluginOptions
	Watcher  *KubeletWatcher
	Log      logr.Logger
	// OnRegistered, if set, is called after each successful registration.
	OnRegistered func()
}

// retryEvery is how often a failed serve or register is retried; the
// kubelet watch makes a restart quicker than that.
const retryEvery = time.Second

// Start serves and registers until ctx ends, then stops serving and removes
// the socket. Registration failures (no kubelet yet) are retried, never
// fatal.
func (p *Plugin) Start(ctx context.Context) error {
	events, unsubscribe := p.Watcher.Subscribe()
	defer unsubscribe()
	sock := filepath.Join(p.Dir, p.Endpoint)
	kubeletSock := filepath.Join(p.Dir, filepath.Base(dp.KubeletSocket))
	log := p.Log.WithValues("resource", p.ResourceName)
	var srv *grpc.Server
	stop := func() {
		if srv != nil {
			srv.Stop()
			srv = nil
		}
		_ = os.Remove(sock)
	}
	defer stop()
	// drop stops serving without touching the socket path, which may
	// already be someone else's.
	drop := func() {
		if srv != nil {
			srv.Stop()
			srv = nil
		}
	}
	// registered names the kubelet we registered with by its socket's inode:
	// a kubelet refuses a second registration of a connected endpoint and,
	// in refusing it, forgets the live connection (it then never notices
	// the plugin go away), so a plugin must register exactly once per
	// kubelet, however many events announce it.
	registered := false
	var kubeletIno uint64
	attempt := true
	for {
		if attempt && (srv == nil || !registered) {
			if srv == nil {
				var err error
				if srv, err = p.serve(sock); err != nil {
					log.Error(err, "serving device plugin")
				}
			}
			if srv != nil {
				if err := p.register(ctx, kubeletSock); err != nil {
					log.V(1).Info("registering with the kubelet failed; will retry", "err", err)
				} else {
					// The socket's inode after the registration, not
					// before: a kubelet restarting meanwhile (the old one
					// already gone, so the registration reached the new
					// one) would otherwise look like a further restart to
					// come, and be registered with twice.
					registered, kubeletIno = true, inode(kubeletSock)
					log.V(1).Info("registered with the kubelet")
					if p.OnRegistered != nil {
						p.OnRegistered()
					}
				}
			}
		}
		attempt = false
		var retry <-chan time.Time
		if srv == nil || !registered {
			retry = time.After(retryEvery)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-retry:
			attempt = true
		case ev := <-events:
			// Our own stops and restarts also remove the socket: only a
			// socket that is missing now means someone else removed it.
			_, statErr := os.Stat(sock)
			missing := statErr != nil
			switch {
			case ev.Name == kubeletSock && ev.Has(fsnotify.Create):
				if registered && !missing && inode(kubeletSock) == kubeletIno {
					break // the kubelet we registered with
				}
				// A new kubelet forgot every plugin: register again.
				log.Info("kubelet restarted; registering again")
				registered, attempt = false, true
				if missing {
					drop()
				}
			case ev.Name == sock && ev.Has(fsnotify.Remove) && missing && srv != nil:
				log.Info("plugin socket removed; serving again")
				drop()
				registered, attempt = false, true
			}
		}
	}
}

// inode identifies the file at path (0 when missing).
func inode(path string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}

func (p *Plugin) serve(sock string) (*grpc.Server, error) {
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	// Closing a listener unlinks its path by default, even when the path
	// is by then a newer socket of ours: the socket is removed by hand.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	srv := grpc.NewServer()
	dp.RegisterDevicePluginServer(srv, p.Service)
	go func() { _ = srv.Serve(l) }()
	return srv, nil
}

func (p *Plugin) register(ctx context.Context, kubeletSock string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	opts := p.Options
	if opts == nil {
		opts = &dp.DevicePluginOptions{}
	}
	_, err = dp.NewRegistrationClient(conn).Register(ctx, &dp.RegisterRequest{
		Version: dp.Version, Endpoint: p.Endpoint, ResourceName: p.ResourceName, Options: opts,
	})
	return err
}
