package linkauth

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dowse-dev/dowse/internal/link/pki"
)

// A flood of requests is answered 429 beyond the burst, before any token is
// looked up, and counted; the edge retries those.
func TestRequestsRateLimited(t *testing.T) {
	ca, err := pki.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tokens, _ := fakeStore(&now)
	metrics := NewMetrics(prometheus.NewRegistry())
	s, err := NewServer(Config{CA: ca, Tokens: tokens, Hosts: []string{"127.0.0.1"}, RequestRate: 0.001, RequestBurst: 3, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	codes := map[int]int{}
	for range 10 {
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodPost, pki.BootstrapPath, strings.NewReader("not json")))
		codes[w.Code]++
		if w.Code == http.StatusTooManyRequests && w.Header().Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
	}
	if codes[http.StatusBadRequest] != 3 || codes[http.StatusTooManyRequests] != 7 {
		t.Fatalf("answers by status: %v, want 3 x 400 (the burst, malformed) and 7 x 429", codes)
	}
	if n := testutil.ToFloat64(metrics.refused.WithLabelValues(requestBootstrap, ReasonRateLimited)); n != 7 {
		t.Fatalf("rate_limited refusals counted %v, want 7", n)
	}
}
