package bootstrap

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestSecretMatches(t *testing.T) {
	stored := []byte(hashSecret("0123456789abcdef"))
	for _, tc := range []struct {
		secret string
		want   bool
	}{
		{"0123456789abcdef", true},
		{"0123456789abcdeF", false},
		{"0123456789abcde0", false},
		{"", false},
		{"0123456789abcdef0", false},
	} {
		if got := secretMatches(tc.secret, stored); got != tc.want {
			t.Errorf("secretMatches(%q) = %v, want %v", tc.secret, got, tc.want)
		}
	}
	if secretMatches("0123456789abcdef", nil) || secretMatches("0123456789abcdef", stored[:10]) {
		t.Error("a missing or cut hash matched")
	}
	if strings.Contains(string(stored), "0123456789abcdef") {
		t.Error("the stored form holds the secret")
	}
}

// fakeStore is a token store on client-go's fake clientset, with a clock
// the test sets.
func fakeStore(now *time.Time) (*Tokens, SecretClient) {
	secrets := fake.NewClientset().CoreV1().Secrets("dowse-system")
	return NewTokens(secrets, func() time.Time { return *now }), secrets
}

func TestCreateValidates(t *testing.T) {
	now := time.Now()
	tokens, secrets := fakeStore(&now)
	for _, tc := range []struct {
		node string
		ttl  time.Duration
	}{{"Edge_A", time.Hour}, {"", time.Hour}, {"edge-a", 0}, {"edge-a", -time.Minute}} {
		if _, _, err := tokens.Create(context.Background(), tc.node, tc.ttl); err == nil {
			t.Errorf("Create(%q, %s) accepted", tc.node, tc.ttl)
		}
	}
	tok, _, err := tokens.Create(context.Background(), "edge-a", 90*time.Second+500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	s, err := secrets.Get(context.Background(), TokenSecretPrefix+tok.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Type != TokenSecretType || s.Labels[LabelToken] != "true" || s.Labels[LabelNode] != "edge-a" {
		t.Errorf("token secret type %q labels %v", s.Type, s.Labels)
	}
	for k, v := range s.Data {
		if strings.Contains(string(v), tok.Secret) {
			t.Errorf("the secret part is stored in clear under %s", k)
		}
	}
	exp, err := time.Parse(time.RFC3339, string(s.Data[keyExpiration]))
	if err != nil {
		t.Fatal(err)
	}
	if d := exp.Sub(now); d > 90*time.Second+500*time.Millisecond || d < 89*time.Second {
		t.Errorf("expiration %s after now, want 90.5 s rounded down to the second", d)
	}
}

func TestDeleteExpired(t *testing.T) {
	now := time.Now()
	tokens, _ := fakeStore(&now)
	ctx := context.Background()
	for _, ttl := range []time.Duration{time.Minute, time.Hour, 2 * time.Hour} {
		if _, _, err := tokens.Create(ctx, "edge-a", ttl); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(90 * time.Minute)
	n, err := tokens.DeleteExpired(ctx)
	if err != nil || n != 2 {
		t.Fatalf("DeleteExpired = %d, %v; want 2", n, err)
	}
	left, err := tokens.List(ctx)
	if err != nil || len(left) != 1 || left[0].Expires.Sub(now) < 29*time.Minute {
		t.Fatalf("left %+v, %v; want the 2 h token", left, err)
	}
}
