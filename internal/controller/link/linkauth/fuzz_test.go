package linkauth

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/dowse-dev/dowse/internal/link/pki"
)

// FuzzRequests feeds any body to the bootstrap and renewal endpoints, as
// anyone who reaches the port may send it (no token known to the cloud, no
// client certificate): neither panics, neither issues a certificate, and
// every answer is a refusal in JSON with a status that says whose fault it
// is (4xx) or that the cloud could not tell (503).
func FuzzRequests(f *testing.F) {
	_, csr, err := pki.NewNodeKeyAndCSR("edge-1")
	if err != nil {
		f.Fatal(err)
	}
	good, _ := json.Marshal(pki.BootstrapRequest{Token: "abcdef.0123456789abcdef", CSR: csr})
	for _, seed := range [][]byte{good, []byte(`{}`), []byte(`{"token":"x","csr":"AAAA"}`), []byte(`{"serviceAccountToken":"a.b.c","csr":null}`), []byte(`[`), nil} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	ca, err := pki.NewCA("fuzz", time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	s, err := NewServer(Config{CA: ca, Tokens: NewTokens(fake.NewClientset().CoreV1().Secrets("dowse-system")), Hosts: []string{"127.0.0.1"},
		RequestRate: 1e9, RequestBurst: 1 << 30, SourceRate: 1e9, SourceBurst: 1 << 30, TokenCleanupInterval: -1})
	if err != nil {
		f.Fatal(err)
	}
	h := s.Handler()
	f.Fuzz(func(t *testing.T, body []byte, renew bool) {
		path := pki.BootstrapPath
		if renew {
			path = pki.RenewPath
		}
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.RemoteAddr = "192.0.2.7:4242"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code < 400 || (rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable) {
			t.Fatalf("%s answered %d to %q: %s", path, rec.Code, body, rec.Body.Bytes())
		}
		var e pki.ErrorResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == "" {
			t.Fatalf("%s answered %d without a JSON error: %q", path, rec.Code, rec.Body.Bytes())
		}
	})
}
