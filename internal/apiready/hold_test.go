package apiready

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
)

// awayAPIServer is a loopback address nothing listens on (yet) and an HTTP
// client of it held by hold.
func awayAPIServer(t *testing.T, hold func(*rest.Config, time.Duration, logr.Logger)) (string, *http.Client) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := &rest.Config{Host: "http://" + addr}
	hold(cfg, 50*time.Millisecond, logr.Discard())
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return addr, hc
}

// TestHoldListsAndWatches: while nothing listens on the API server's
// address, a list and a watch wait and go through once it answers (one
// request reaching it each); a get and a write fail at once; a held list
// ends with its context.
func TestHoldListsAndWatches(t *testing.T) {
	addr, hc := awayAPIServer(t, HoldListsAndWatches)
	get := func(ctx context.Context, method, path string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, nil)
		if err != nil {
			return "", err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}

	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/api/v1/namespaces/default/pods/p"},
		{http.MethodPost, "/api/v1/namespaces/default/pods"},
		{http.MethodGet, "/apis/dowse.dev/v1alpha1/namespaces/default/devices/d"},
	} {
		if _, err := get(t.Context(), c.method, c.path); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s %s while the server is away: %v, want connection refused at once", c.method, c.path, err)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err := get(ctx, http.MethodGet, "/api/v1/pods")
	cancel()
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a held list whose context ended: %v, want its last connection refused", err)
	}

	type result struct {
		body string
		err  error
	}
	paths := []string{"/apis/dowse.dev/v1alpha1/namespaces/default/devices", "/api/v1/nodes?watch=true&resourceVersion=7"}
	results := make(chan result, len(paths))
	for _, p := range paths {
		go func() {
			b, err := get(t.Context(), http.MethodGet, p)
			results <- result{b, err}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	select {
	case r := <-results:
		t.Fatalf("a list or watch returned while the server was away: %+v", r)
	default:
	}

	var served atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		_, _ = io.WriteString(w, "served "+r.URL.Path)
	})}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	for range paths {
		r := <-results
		if r.err != nil || !strings.HasPrefix(r.body, "served /api") {
			t.Errorf("a held request once the server answers: %q, %v", r.body, r.err)
		}
	}
	if n := served.Load(); n != int32(len(paths)) {
		t.Errorf("the server got %d requests, want %d (a held request is sent once it connects)", n, len(paths))
	}
}

func TestIsListOrWatch(t *testing.T) {
	for path, want := range map[string]bool{
		"/api/v1/pods":                                                     true,
		"/api/v1/namespaces":                                               true,
		"/api/v1/namespaces/default":                                       false,
		"/api/v1/namespaces/default/pods":                                  true,
		"/api/v1/namespaces/default/pods/p":                                false,
		"/api/v1/namespaces/default/pods/p/log":                            false,
		"/apis/dowse.dev/v1alpha1/devices":                                 true,
		"/apis/dowse.dev/v1alpha1/namespaces/default/devices":              true,
		"/apis/dowse.dev/v1alpha1/namespaces/default/devices/d":            false,
		"/apis/coordination.k8s.io/v1/namespaces/x/leases/l":               false,
		"/apis/dowse.dev/v1alpha1/namespaces/default/devices/d?watch=true": true,
		"/api":                     false,
		"/apis":                    false,
		"/apis/dowse.dev/v1alpha1": false,
		"/healthz":                 false,
		"/version":                 false,
	} {
		p, q, _ := strings.Cut(path, "?")
		req := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: p, RawQuery: q}}
		if got := isListOrWatch(req); got != want {
			t.Errorf("isListOrWatch(GET %s) = %v, want %v", path, got, want)
		}
	}
}

// TestHoldRequests: every request waits while nothing listens, a write
// sent once it does with its body whole.
func TestHoldRequests(t *testing.T) {
	addr, hc := awayAPIServer(t, HoldRequests)
	const body = `{"status":{"twins":[]}}`
	got := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPatch, "http://"+addr+"/apis/dowse.dev/v1alpha1/namespaces/default/devices/d/status", strings.NewReader(body))
		if err != nil {
			done <- err
			return
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("a write returned while the server was away: %v", err)
	default:
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r.Method + " " + string(b)
	})}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	if err := <-done; err != nil {
		t.Fatalf("the held write: %v", err)
	}
	if g := <-got; g != http.MethodPatch+" "+body {
		t.Errorf("the server got %q, want the PATCH with its body", g)
	}
}
