package handler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// metrics are a handler's counters, written in the Prometheus text format
// by the Server itself: handlers stay free of client_golang, as mappers do.
// Every metric carries the handler's name.
type metrics struct {
	handler string

	streamsOpened  atomic.Uint64
	streamsOpen    atomic.Int64
	listsSent      atomic.Uint64
	listsUnchanged atomic.Uint64
	devices        atomic.Int64 // in the newest list sent on any stream
	registrations  atomic.Uint64
	registerFails  atomic.Uint64

	mu           sync.Mutex
	streamErrors map[codes.Code]uint64 // streams that ended in an error, by gRPC code
	skipped      map[string]uint32     // candidates skipped, by reason, in the newest list sent
}

func newMetrics(handler string) *metrics {
	return &metrics{handler: handler, streamErrors: map[codes.Code]uint64{}}
}

func (m *metrics) setSkipped(rs []*discoveryv1.SkippedReason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.skipped = make(map[string]uint32, len(rs))
	for _, r := range rs {
		m.skipped[r.GetReason()] = r.GetCount()
	}
}

func (m *metrics) streamFailed(c codes.Code) {
	m.mu.Lock()
	m.streamErrors[c]++
	m.mu.Unlock()
}

// ServeHTTP writes every metric in the Prometheus text exposition format.
func (m *metrics) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	var b strings.Builder
	l := fmt.Sprintf(`handler=%q`, m.handler)
	metric := func(name, typ, help string, v any) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %v\n", name, help, name, typ, name, l, v)
	}
	metric("dowse_handler_discover_streams_total", "counter", "Discover streams the agent opened.", m.streamsOpened.Load())
	metric("dowse_handler_discover_streams", "gauge", "Discover streams open now.", m.streamsOpen.Load())
	metric("dowse_handler_device_lists_sent_total", "counter", "Device lists sent to the agent.", m.listsSent.Load())
	metric("dowse_handler_device_lists_unchanged_total", "counter", "Device lists not sent because they equal the one sent before.", m.listsUnchanged.Load())
	metric("dowse_handler_devices", "gauge", "Devices in the newest list sent.", m.devices.Load())
	metric("dowse_handler_registrations_total", "counter", "Registrations the agent accepted.", m.registrations.Load())
	metric("dowse_handler_registration_failures_total", "counter", "Registration calls that failed (the agent is away, or refused).", m.registerFails.Load())
	m.mu.Lock()
	codesSeen := make([]codes.Code, 0, len(m.streamErrors))
	for c := range m.streamErrors {
		codesSeen = append(codesSeen, c)
	}
	slices.Sort(codesSeen)
	const name = "dowse_handler_discover_errors_total"
	fmt.Fprintf(&b, "# HELP %s Discover streams that ended in an error other than the agent closing them, by gRPC code.\n# TYPE %s counter\n", name, name)
	for _, c := range codesSeen {
		fmt.Fprintf(&b, "%s{%s,code=%q} %d\n", name, l, c.String(), m.streamErrors[c])
	}
	reasons := make([]string, 0, len(m.skipped))
	for r := range m.skipped {
		reasons = append(reasons, r)
	}
	slices.Sort(reasons)
	const skippedName = "dowse_handler_skipped_candidates"
	fmt.Fprintf(&b, "# HELP %s Candidates skipped in the newest list sent, by reason.\n# TYPE %s gauge\n", skippedName, skippedName)
	for _, r := range reasons {
		fmt.Fprintf(&b, "%s{%s,reason=%q} %d\n", skippedName, l, r, m.skipped[r])
	}
	m.mu.Unlock()
	// As every Go process of Dowse's says (make soak watches it for leaks).
	fmt.Fprintf(&b, "# HELP go_goroutines Number of goroutines that currently exist.\n# TYPE go_goroutines gauge\ngo_goroutines %d\n", runtime.NumGoroutine())
	_, _ = w.Write([]byte(b.String()))
}

// serveMetrics serves /metrics on addr until ctx ends. It is an optional
// part: a failure to listen is logged and the handler goes on discovering.
func (s *Server) serveMetrics(ctx context.Context, addr string) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		s.log.Error(err, "metrics endpoint not served", "address", addr)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.metrics)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error(err, "metrics endpoint failed", "address", addr)
		}
	}()
	s.log.Info("serving metrics", "address", lis.Addr().String())
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-done
}
