package bootstrap

import (
	"bytes"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/link/pki"
)

// TestTokenSecretRoundTrip: what TokenSecret and MarkTokenUsed write,
// ParseTokenSecret reads back, and a Secret that is not a token's is
// refused.
func TestTokenSecretRoundTrip(t *testing.T) {
	tok, err := pki.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	expires := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	s := TokenSecret(tok, "edge-1", expires)
	info, err := ParseTokenSecret(s)
	if err != nil {
		t.Fatal(err)
	}
	if info.ID != tok.ID || info.Node != "edge-1" || !info.Expires.Equal(expires) || !info.UsedAt.IsZero() || info.UsedBy([]byte("key")) {
		t.Fatalf("parsed %+v, want id %s, node edge-1, expiring %s, unused", info, tok.ID, expires)
	}
	if !TokenSecretMatches(s, tok.Secret) || TokenSecretMatches(s, tok.ID) {
		t.Error("the stored hash does not match exactly the token's secret")
	}

	used := expires.Add(-time.Minute).Add(123 * time.Millisecond)
	marked := MarkTokenUsed(s, used, []byte("key"))
	if _, ok := s.Data[keyUsedAt]; ok {
		t.Error("MarkTokenUsed changed its argument")
	}
	info, err = ParseTokenSecret(marked)
	if err != nil {
		t.Fatal(err)
	}
	if !info.UsedAt.Equal(used) || !info.UsedBy([]byte("key")) || info.UsedBy([]byte("other key")) {
		t.Fatalf("parsed %+v, want used at %s by key", info, used)
	}
	if bytes.Contains(marked.Data[keyUsedByKey], []byte("key")) {
		t.Error("the key is stored, not its hash")
	}

	for name, change := range map[string]func(){
		"wrong type":          func() { s.Type = "Opaque" },
		"name not its id":     func() { s.Name = TokenSecretPrefix + "other" },
		"no expiration":       func() { delete(s.Data, keyExpiration) },
		"garbled used-at":     func() { s.Data[keyUsedAt] = []byte("yesterday") },
		"expiration in words": func() { s.Data[keyExpiration] = []byte("soon") },
	} {
		s = TokenSecret(tok, "edge-1", expires)
		change()
		if _, err := ParseTokenSecret(s); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// TestCASecretRoundTrip: the CA CASecret keeps is the one ParseCASecret
// reads, and a Secret without a usable key is refused.
func TestCASecretRoundTrip(t *testing.T) {
	ca, err := pki.NewCA(caCommonName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s, err := CASecret(ca)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != CASecretName {
		t.Errorf("secret named %q, want %q", s.Name, CASecretName)
	}
	got, err := ParseCASecret(s)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Cert.Equal(ca.Cert) || pki.CAPin(got.Cert) != pki.CAPin(ca.Cert) {
		t.Error("the parsed CA is not the one kept")
	}
	delete(s.Data, "tls.key")
	if _, err := ParseCASecret(s); err == nil {
		t.Error("a CA Secret without its key parsed")
	}
}
