package dmi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
)

// maxRemoveFailures: a removal the mapper keeps failing is given up after
// this many attempts (the mapper gets a clean slate when it registers again).
const maxRemoveFailures = 5

// mapper is one registration: its client and what it has accepted. Only
// its worker touches devices, models and removeFailures after it starts.
type mapper struct {
	info     *dmiv1beta1.MapperInfo
	conn     *grpc.ClientConn
	client   dmiv1beta1.DeviceMapperServiceClient
	kick     chan struct{}
	cancel   context.CancelFunc
	done     chan struct{}
	healthy  atomic.Bool
	restored bool // remembered from before an agent restart: what it holds is unknown
	// registrant is the process that registered it (peer.go). Zero for one
	// remembered from an agent that did not record it: the process serving
	// its socket is adopted on its first report. Under mu.
	registrant caller
	// since orders the registrations of one protocol: the mapper that has
	// held its name longest serves the protocol's Devices that name no
	// mapper, so that a newcomer (another process on the socket) cannot take
	// them by picking a name that sorts first. Kept across re-registrations
	// and agent restarts.
	since uint64
	// unreachableSince is when calls started failing as unreachable (zero:
	// reachable). The worker's own.
	unreachableSince time.Time

	// devices and models are what it accepted (key -> signature; "" for
	// one remembered across an agent restart). The worker writes them
	// under mu; writeMappers reads them.
	mu             sync.Mutex
	devices        map[string]string
	models         map[string]string
	removeFailures map[string]int
}

// set records that the mapper holds key (of devices or models) with sig,
// and whether it is a key it did not hold before.
func (m *mapper) set(held map[string]string, key, sig string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, had := held[key]
	held[key] = sig
	return !had
}

func (m *mapper) forget(held map[string]string, key string) {
	m.mu.Lock()
	delete(held, key)
	m.mu.Unlock()
}

// held lists the keys of devices and models the mapper holds, sorted.
func (m *mapper) held() (devices, models []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.devices {
		devices = append(devices, k)
	}
	for k := range m.models {
		models = append(models, k)
	}
	sort.Strings(devices)
	sort.Strings(models)
	return devices, models
}

// mapperAddress is the mapper's DeviceMapperService socket path
// (MapperInfo.address; a unix:// prefix is allowed).
func mapperAddress(info *dmiv1beta1.MapperInfo) string {
	a := strings.TrimSpace(string(info.GetAddress()))
	a = strings.TrimPrefix(a, "unix://")
	return strings.TrimPrefix(a, "unix:")
}

// maxSocketPath is the room in sockaddr_un.sun_path on Linux less its NUL.
const maxSocketPath = 107

// checkAddress refuses a socket path the agent could never dial, or could
// not remember as the mapper sent it (dmi-mappers.json holds text): not
// UTF-8, a NUL byte, longer than a Unix socket path may be.
func checkAddress(addr string) error {
	switch {
	case !utf8.ValidString(addr):
		return fmt.Errorf("address %q is not valid UTF-8", addr)
	case strings.ContainsRune(addr, 0):
		return fmt.Errorf("address %q holds a NUL byte", addr)
	case len(addr) > maxSocketPath:
		return fmt.Errorf("address %q is %d bytes, more than a Unix socket path may be (%d)", addr, len(addr), maxSocketPath)
	}
	return nil
}

func (s *Server) newMapper(info *dmiv1beta1.MapperInfo) (*mapper, error) {
	addr := mapperAddress(info)
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		return nil, err
	}
	m := &mapper{info: proto.CloneOf(info), conn: conn, client: dmiv1beta1.NewDeviceMapperServiceClient(conn),
		kick: make(chan struct{}, 1), done: make(chan struct{}), cancel: func() {},
		devices: map[string]string{}, models: map[string]string{}, removeFailures: map[string]int{}}
	m.healthy.Store(true)
	m.requestSync()
	return m, nil
}

// speaksFor reports whether who may report for m's Devices. A mapper
// remembered without its registrant adopts the process serving its
// socket, which is the one the agent hands its Devices to.
func (m *mapper) speaksFor(ctx context.Context, who caller) (ok, adopted bool, err error) {
	if !who.Known {
		return true, false, nil // the agent's own process
	}
	m.mu.Lock()
	reg := m.registrant
	m.mu.Unlock()
	if reg.Known {
		return reg.Same(who), false, nil
	}
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	served, err := listenerOf(lctx, mapperAddress(m.info))
	if err != nil {
		return false, false, fmt.Errorf("the mapper's socket %s: %w", mapperAddress(m.info), err)
	}
	m.mu.Lock()
	if !m.registrant.Known {
		m.registrant, adopted = served, true
	}
	reg = m.registrant
	m.mu.Unlock()
	return reg.Same(who), adopted, nil
}

func (m *mapper) requestSync() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// startLocked runs m's worker under ctx, the server's run context (its
// worker lives as long as the server, not as the call that registered it).
func (s *Server) startLocked(ctx context.Context, m *mapper) {
	ctx, cancel := context.WithCancel(ctx)
	m.cancel = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(m.done)
		s.work(ctx, m)
	}()
}

func (s *Server) work(ctx context.Context, m *mapper) {
	log := logr.FromContextOrDiscard(ctx).WithValues("mapper", m.info.GetName(), "protocol", m.info.GetProtocol())
	ctx = logr.NewContext(ctx, log)
	backoff := s.cfg.RetryMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
		}
		err := s.reconcile(ctx, m)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			backoff = s.cfg.RetryMin
			continue
		}
		if !m.unreachableSince.IsZero() && s.cfg.ForgetAfter > 0 && s.cfg.Now().Sub(m.unreachableSince) >= s.cfg.ForgetAfter {
			s.forget(ctx, m)
			return
		}
		log.Error(err, "mapper call failed; retrying", "retryIn", backoff.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.cfg.RetryMax)
		m.requestSync()
	}
}

func signature(m proto.Message) string {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	return string(b)
}

// call runs one DeviceMapperService call with the call timeout and keeps
// the mapper's health and the metrics.
func (s *Server) call(ctx context.Context, m *mapper, method string, f func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	err := f(cctx)
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.metrics.call(method, err)
	c := status.Code(err)
	healthy := err == nil || (c != codes.Unavailable && c != codes.DeadlineExceeded)
	switch {
	case healthy:
		m.unreachableSince = time.Time{}
	case m.unreachableSince.IsZero():
		m.unreachableSince = s.cfg.Now()
	}
	if m.healthy.Swap(healthy) != healthy {
		s.mu.Lock()
		s.updateConnectedLocked()
		s.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	return nil
}

// reconcile makes the calls that bring m to what it should hold; it stops
// at the first failure (the worker retries the whole pass).
func (s *Server) reconcile(ctx context.Context, m *mapper) (err error) {
	changed := false // the set of keys held: remembered across agent restarts
	defer func() {
		if changed {
			if werr := s.writeMappers(); werr != nil {
				logr.FromContextOrDiscard(ctx).Error(werr, "cannot remember what the mapper holds")
			}
		}
	}()
	s.mu.Lock()
	devs, models := s.assignedLocked(m.info.GetName())
	s.mu.Unlock()
	wait := []grpc.CallOption{grpc.WaitForReady(true)}

	modelSig := map[string]string{}
	for _, md := range models {
		k := refKey(md.GetRef())
		dm := toDMIModel(md)
		sig := signature(dm)
		modelSig[k] = sig
		had, known := m.models[k]
		if known && had == sig {
			continue
		}
		if !known {
			changed = m.set(m.models, k, "") || changed // as for devices below
		}
		var err error
		if known || m.restored {
			err = s.call(ctx, m, "UpdateDeviceModel", func(ctx context.Context) error {
				_, err := m.client.UpdateDeviceModel(ctx, &dmiv1beta1.UpdateDeviceModelRequest{Model: dm}, wait...)
				return err
			})
		}
		if !(known || m.restored) || err != nil {
			err = s.call(ctx, m, "CreateDeviceModel", func(ctx context.Context) error {
				_, err := m.client.CreateDeviceModel(ctx, &dmiv1beta1.CreateDeviceModelRequest{Model: dm}, wait...)
				return err
			})
		}
		if err != nil {
			return fmt.Errorf("model %s: %w", k, err)
		}
		changed = m.set(m.models, k, sig) || changed
	}

	want := map[string]bool{}
	for _, d := range devs {
		k := refKey(d.GetRef())
		want[k] = true
		dd := toDMIDevice(d)
		sig := signature(dd) + modelSig[modelKey(d)]
		had, known := m.devices[k]
		if known && had == sig {
			continue
		}
		if !known {
			// Held from the call on, content unknown: a call cut short (the
			// agent stopping while the mapper took it) must not leave the
			// mapper holding a device this agent would never remove.
			changed = m.set(m.devices, k, "") || changed
		}
		var err error
		if known || m.restored {
			err = s.call(ctx, m, "UpdateDevice", func(ctx context.Context) error {
				_, err := m.client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: dd}, wait...)
				return err
			})
		}
		if !(known || m.restored) || err != nil {
			err = s.call(ctx, m, "RegisterDevice", func(ctx context.Context) error {
				_, err := m.client.RegisterDevice(ctx, &dmiv1beta1.RegisterDeviceRequest{Device: dd}, wait...)
				return err
			})
		}
		if err != nil {
			return fmt.Errorf("device %s: %w", k, err)
		}
		changed = m.set(m.devices, k, sig) || changed
		s.mu.Lock()
		if t, ok := s.pending[k]; ok {
			s.metrics.delivered(s.cfg.Now().Sub(t))
			delete(s.pending, k)
		}
		s.mu.Unlock()
		logr.FromContextOrDiscard(ctx).V(1).Info("device sent to mapper", "device", k, "again", known)
	}

	var errs []error
	for k := range m.devices {
		if want[k] {
			continue
		}
		ns, name, _ := strings.Cut(k, "/")
		err := s.call(ctx, m, "RemoveDevice", func(ctx context.Context) error {
			_, err := m.client.RemoveDevice(ctx, &dmiv1beta1.RemoveDeviceRequest{DeviceName: name, DeviceNamespace: ns}, wait...)
			return err
		})
		if err != nil && status.Code(err) != codes.NotFound {
			if m.removeFailures[k]++; m.removeFailures[k] < maxRemoveFailures {
				errs = append(errs, fmt.Errorf("device %s: %w", k, err))
				continue
			}
			logr.FromContextOrDiscard(ctx).Error(err, "giving up removing a device from the mapper", "device", k)
		}
		m.forget(m.devices, k)
		changed = true
		delete(m.removeFailures, k)
	}
	for k := range m.models {
		if _, ok := modelSig[k]; ok {
			continue
		}
		ns, name, _ := strings.Cut(k, "/")
		err := s.call(ctx, m, "RemoveDeviceModel", func(ctx context.Context) error {
			_, err := m.client.RemoveDeviceModel(ctx, &dmiv1beta1.RemoveDeviceModelRequest{ModelName: name, ModelNamespace: ns}, wait...)
			return err
		})
		if err != nil && status.Code(err) != codes.NotFound {
			if m.removeFailures["model:"+k]++; m.removeFailures["model:"+k] < maxRemoveFailures {
				errs = append(errs, fmt.Errorf("model %s: %w", k, err))
				continue
			}
			logr.FromContextOrDiscard(ctx).Error(err, "giving up removing a model from the mapper", "model", k)
		}
		m.forget(m.models, k)
		changed = true
		delete(m.removeFailures, "model:"+k)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	m.restored = false
	return nil
}
