package apiready

import (
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
)

// HoldListsAndWatches makes cfg's lists and watches that cannot connect to
// the API server wait for it, trying again every [every/2, every) until
// their context ends, instead of failing. client-go's reflectors back off
// after each failed list or watch, to 30 s doubled by jitter, and forget
// that back-off only after two quiet minutes: after an outage of a minute,
// informers came back up to a minute after the API server did. A held
// request goes through as soon as the API server answers again. Only
// requests that never connected are tried again (the server never received
// them), and only lists and watches, which informers make: a get or a
// write still fails, so its caller's own retry (and an agent's offline
// work) is unchanged. An outage is logged when the first request is held
// and when one goes through again. every is 1 s when not positive.
func HoldListsAndWatches(cfg *rest.Config, every time.Duration, log logr.Logger) {
	holdWhere(cfg, every, log, isListOrWatch)
}

// HoldRequests is HoldListsAndWatches for every request: for a process
// that can do nothing without the API server (the controller), whose
// writers would otherwise back off through an outage as the reflectors do
// and come back after it by their back-off, not when it answers.
func HoldRequests(cfg *rest.Config, every time.Duration, log logr.Logger) {
	holdWhere(cfg, every, log, func(*http.Request) bool { return true })
}

func holdWhere(cfg *rest.Config, every time.Duration, log logr.Logger, held func(*http.Request) bool) {
	if every <= 0 {
		every = time.Second
	}
	h := &hold{every: every, log: log, held: held}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &holdingTransport{hold: h, next: rt} })
}

// hold is the outage state the transports of one configuration share.
type hold struct {
	every time.Duration
	log   logr.Logger
	held  func(*http.Request) bool

	mu        sync.Mutex
	awaySince time.Time
}

func (h *hold) unreachable(req *http.Request, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.awaySince.IsZero() {
		h.awaySince = time.Now()
		h.log.Info("the API server cannot be reached; requests wait for it", "request", req.Method+" "+req.URL.Path, "reason", err.Error())
	}
}

func (h *hold) reached() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.awaySince.IsZero() {
		h.log.Info("the API server answers again; held requests go on", "unreachableFor", time.Since(h.awaySince).Round(time.Millisecond).String())
		h.awaySince = time.Time{}
	}
}

// pause is how long a held request waits before trying again.
func (h *hold) pause() time.Duration {
	return h.every/2 + rand.N(h.every/2+1)
}

type holdingTransport struct {
	*hold
	next http.RoundTripper
}

func (t *holdingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.held(req) || (req.Body != nil && req.Body != http.NoBody && req.GetBody == nil) {
		return t.next.RoundTrip(req)
	}
	try := req
	for {
		resp, err := t.next.RoundTrip(try)
		if err == nil {
			t.reached()
			return resp, nil
		}
		if !neverConnected(err) {
			return nil, err
		}
		// The body was never sent, but the transport may have read it.
		if req.GetBody != nil {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			try = req.Clone(req.Context())
			try.Body = body
		}
		t.unreachable(req, err)
		timer := time.NewTimer(t.pause())
		select {
		case <-req.Context().Done():
			timer.Stop()
			return nil, err
		case <-timer.C:
		}
	}
}

// WrappedRoundTripper lets client-go find the transport below.
func (t *holdingTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

// neverConnected says whether err is a failure to open a connection: the
// API server refused it, could not be routed to, or did not answer in
// time. The request was not sent.
func neverConnected(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// isListOrWatch says whether req is a GET of a collection (a list) or a
// watch, the requests of the Kubernetes API path layout
// (/api/v1/[namespaces/NS/]RESOURCE and /apis/GROUP/VERSION/...) an
// informer makes.
func isListOrWatch(req *http.Request) bool {
	if req.Method != http.MethodGet {
		return false
	}
	if w := req.URL.Query().Get("watch"); w == "true" || w == "1" {
		return true
	}
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(parts) > 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) > 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return false
	}
	if len(parts) > 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	return len(parts) == 1
}
