package discovery

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/internal/agent/instances"
	"github.com/dowse-dev/dowse/internal/agent/registry"
	"github.com/dowse-dev/dowse/internal/backoff"
	discoveryv0 "github.com/dowse-dev/dowse/proto/discovery/v0"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// maxDiscoverMessage bounds one device list; 10,000 devices with a few
// properties each fit comfortably.
const maxDiscoverMessage = 64 << 20

const reasonStarting = "Starting"

// registrationWindow is how long a new session waits for its handler to
// register before reporting it missing.
const registrationWindow = 5 * time.Second

// sessionState is what a session reports for the Configuration's status.
type sessionState struct {
	handler     metav1.Condition
	discovering metav1.Condition
	devices     int32
	// dropped are devices the handler sent that were not taken (over the
	// cap, a name collision).
	dropped int32
	// skipped are the candidates the handler skipped, as it last said.
	skipped []v1alpha1.SkippedReason
}

func (a sessionState) equal(b sessionState) bool {
	return a.handler == b.handler && a.discovering == b.discovering && a.devices == b.devices && a.dropped == b.dropped &&
		equality.Semantic.DeepEqual(a.skipped, b.skipped)
}

// list is one complete device list from a handler.
type list struct {
	devices []*discoveryv1.Device
	skipped []*discoveryv1.SkippedReason
	shared  bool
}

// skippedStatus is a handler's skipped summary as the Configuration's
// status holds it. The handler SDK bounds what it sends; a handler of
// another SDK is bounded here the same way.
func skippedStatus(in []*discoveryv1.SkippedReason) []v1alpha1.SkippedReason {
	if len(in) == 0 {
		return nil
	}
	out := make([]v1alpha1.SkippedReason, 0, min(len(in), handler.MaxSkippedReasons))
	seen := map[string]bool{}
	for _, r := range in {
		if r.GetReason() == "" || seen[r.GetReason()] || len(out) == handler.MaxSkippedReasons {
			continue
		}
		seen[r.GetReason()] = true
		sr := v1alpha1.SkippedReason{Reason: cut(r.GetReason(), 64), Count: int32(min(r.GetCount(), math.MaxInt32))}
		cands := r.GetCandidates()
		if len(cands) > handler.MaxSkippedCandidates {
			cands = cands[:handler.MaxSkippedCandidates]
		}
		for _, c := range cands {
			sr.Candidates = append(sr.Candidates, v1alpha1.SkippedCandidate{Candidate: cut(c.GetCandidate(), 256), Message: cut(c.GetMessage(), 256)})
		}
		out = append(out, sr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Reason < out[j].Reason })
	return out
}

// cut shortens s to at most n bytes, on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// session keeps one Discover stream open for one Configuration on this node
// and turns what it receives into Instances. A session is replaced, never
// changed, when the Configuration or its resolved properties change.
type session struct {
	key        string
	cfg        *v1alpha1.Configuration
	request    *discoveryv1.DiscoverRequest
	blocked    string // why the stream must not be opened (e.g. a property did not resolve)
	grace      time.Duration
	maxDevices int
	hostPaths  HostPaths

	registry *registry.Registry
	writer   *instances.Writer
	notify   func() // asks the reconciler to write the status
	log      logr.Logger

	cancel context.CancelFunc
	done   chan struct{}
	resync chan struct{}

	mu    sync.Mutex
	state sessionState
}

func (s *session) start(parent context.Context) {
	ctx, cancel := context.WithCancel(parent)
	s.cancel = cancel
	s.done = make(chan struct{})
	s.resync = make(chan struct{}, 1)
	s.state = sessionState{
		handler:     metav1.Condition{Type: v1alpha1.ConditionHandlerAvailable, Status: metav1.ConditionUnknown, Reason: reasonStarting, Message: "looking for the handler"},
		discovering: metav1.Condition{Type: v1alpha1.ConditionDiscovering, Status: metav1.ConditionUnknown, Reason: reasonStarting, Message: "no device list received yet"},
	}
	go func() {
		defer close(s.done)
		s.run(logr.NewContext(ctx, s.log))
	}()
}

func (s *session) stop() {
	s.cancel()
	<-s.done
}

// requestResync makes the session compare its last list with the cache
// again, e.g. after someone deleted one of its Instances.
func (s *session) requestResync() {
	select {
	case s.resync <- struct{}{}:
	default:
	}
}

func (s *session) snapshot() sessionState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

func (s *session) update(f func(*sessionState)) {
	s.mu.Lock()
	before := s.state
	f(&s.state)
	changed := !before.equal(s.state)
	s.mu.Unlock()
	if changed {
		s.notify()
	}
}

func (s *session) setHandler(st metav1.ConditionStatus, reason, msg string) {
	s.update(func(x *sessionState) { x.handler.Status, x.handler.Reason, x.handler.Message = st, reason, msg })
}

func (s *session) setDiscovering(st metav1.ConditionStatus, reason, msg string) {
	s.update(func(x *sessionState) {
		x.discovering.Status, x.discovering.Reason, x.discovering.Message = st, reason, msg
	})
}

// run owns all writes for the Configuration on this node. The stream
// goroutine only delivers lists; run applies the newest one, retries failed
// writes, and releases the devices when the handler has been gone for the
// grace period. It returns when ctx ends, after stream has (stream never
// blocks on run: it hands lists over with offer).
func (s *session) run(ctx context.Context) {
	lists := make(chan list, 1)
	lost := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.stream(ctx, lists, lost) })

	grace := time.NewTimer(s.grace) // also covers a handler that never comes
	graceRunning := true
	retry := time.NewTimer(0)
	<-retry.C
	writeRetry := backoff.Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second}

	var target list
	have := false // whether target holds anything to apply yet
	applyTarget := func() {
		kept, problem := screen(target.devices, s.maxDevices, s.hostPaths)
		if problem != "" {
			s.log.Info("dropped devices the handler sent", "problem", problem)
		}
		res, err := s.writer.Sync(ctx, s.cfg, target.shared, kept)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := writeRetry.Next()
			s.log.Error(err, "writing instances failed; retrying", "after", d)
			retry.Reset(d)
			return
		}
		writeRetry.Reset()
		s.update(func(x *sessionState) {
			x.devices = int32(len(kept) - len(res.Collisions))
			x.dropped = int32(len(target.devices)) - x.devices
			x.skipped = skippedStatus(target.skipped)
		})
		if target.devices == nil { // released after the grace period, not a list
			return
		}
		msg := fmt.Sprintf("%d devices", len(kept))
		if problem != "" {
			msg += "; " + problem
		}
		for _, c := range res.Collisions {
			msg += "; " + c
		}
		if problem != "" || len(res.Collisions) > 0 {
			s.log.Info("handler sent devices that were dropped", "problem", msg)
		}
		s.setDiscovering(metav1.ConditionTrue, "Discovered", msg)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case l := <-lists:
			if graceRunning {
				grace.Stop()
				graceRunning = false
			}
			if l.devices == nil {
				l.devices = []*discoveryv1.Device{}
			}
			target, have = l, true
			applyTarget()
		case <-lost:
			if !graceRunning {
				grace.Reset(s.grace)
				graceRunning = true
			}
		case <-grace.C:
			graceRunning = false
			s.log.Info("handler gone for the grace period; releasing its devices", "grace", s.grace)
			target, have = list{}, true
			applyTarget()
		case <-s.resync:
			if have {
				applyTarget()
			}
		case <-retry.C:
			if have {
				applyTarget()
			}
		}
	}
}

// stream keeps a Discover stream open while the handler is registered and
// hands every list to run. It tells run when the stream is lost.
func (s *session) stream(ctx context.Context, lists chan list, lost chan<- struct{}) {
	changes, cancel := s.registry.Watch()
	defer cancel()
	signalLost := func() {
		select {
		case lost <- struct{}{}:
		default:
		}
	}
	name := s.cfg.Spec.DiscoveryHandler.Name
	startedAt := time.Now()
	reconnect := backoff.Backoff{Initial: 200 * time.Millisecond, Max: 30 * time.Second}
	// waitChange waits for the handler's registration to differ from gen, or
	// for d to pass when d > 0.
	waitChange := func(gen uint64, d time.Duration) {
		var timeout <-chan time.Time
		if d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			timeout = t.C
		}
		for {
			if h, ok := s.registry.Get(name); ok && h.Generation != gen {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-timeout:
				return
			case <-changes:
			}
		}
	}
	if s.blocked != "" {
		signalLost()
		s.setDiscovering(metav1.ConditionFalse, "PropertiesUnresolved", s.blocked)
		<-ctx.Done()
		return
	}
	for ctx.Err() == nil {
		h, ok := s.registry.Get(name)
		if !ok {
			signalLost()
			if wait := time.Until(startedAt.Add(registrationWindow)); wait > 0 {
				// Right after an agent restart the handlers have not
				// registered again yet; give them a moment before saying so.
				waitChange(0, wait)
				continue
			}
			s.setHandler(metav1.ConditionFalse, "NotRegistered", fmt.Sprintf("no discovery handler named %q is registered on this node", name))
			waitChange(0, 0)
			continue
		}
		err := s.discover(ctx, h, lists)
		signalLost()
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.InvalidArgument {
			s.setHandler(metav1.ConditionTrue, "Registered", "handler rejected the request")
			s.setDiscovering(metav1.ConditionFalse, "InvalidDetails", status.Convert(err).Message())
			s.log.Info("handler rejected the discovery details", "reason", status.Convert(err).Message())
			// Retrying cannot help until the Configuration changes (a new
			// session) or the handler is replaced.
			waitChange(h.Generation, 0)
			continue
		}
		d := reconnect.Next()
		s.setHandler(metav1.ConditionFalse, "Unreachable", fmt.Sprintf("discover stream to %s failed: %v", h.Endpoint, err))
		s.log.Info("discover stream ended; reconnecting", "endpoint", h.Endpoint, "err", err, "after", d)
		waitChange(h.Generation, d)
	}
}

// discover runs one Discover stream until it fails or ctx ends.
func (s *session) discover(ctx context.Context, h registry.Handler, lists chan list) error {
	target := h.Endpoint
	if h.EndpointType == registry.UDS {
		target = "unix://" + h.Endpoint
	}
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxDiscoverMessage)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var recv func() (*discoveryv1.DiscoverResponse, error)
	if h.Protocol == registry.ProtocolV0 {
		st, err := discoveryv0.NewDiscoveryHandlerClient(conn).Discover(ctx, s.request)
		if err != nil {
			return err
		}
		recv = st.Recv
	} else {
		st, err := discoveryv1.NewDiscoveryHandlerClient(conn).Discover(ctx, s.request)
		if err != nil {
			return err
		}
		recv = st.Recv
	}
	first := true
	for {
		resp, err := recv()
		if err != nil {
			return err
		}
		if first {
			first = false
			s.setHandler(metav1.ConditionTrue, "Registered", "discovering through "+h.Endpoint)
		}
		offer(lists, list{devices: resp.GetDevices(), skipped: resp.GetSkipped(), shared: h.Shared})
	}
}

// offer replaces any list run has not taken yet: only the newest matters,
// since each list is the whole truth.
func offer(ch chan list, l list) {
	for {
		select {
		case ch <- l:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}
