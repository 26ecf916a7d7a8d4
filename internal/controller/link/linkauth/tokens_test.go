package linkauth

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/dowse-dev/dowse/internal/bootstrap"
	"github.com/dowse-dev/dowse/internal/link/pki"
)

// fakeStore is a token store on client-go's fake clientset, with a clock
// the test sets.
func fakeStore(now *time.Time) (*Tokens, bootstrap.SecretClient) {
	secrets := fake.NewClientset().CoreV1().Secrets("dowse-system")
	tokens := NewTokens(secrets)
	tokens.now = func() time.Time { return *now }
	return tokens, secrets
}

func TestConsume(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		after  time.Duration // clock advance before use
		node   string
		token  func(pki.Token) string
		reason string // "" = accepted
	}{
		{name: "good", after: 59 * time.Minute, node: "edge-a"},
		{name: "last second", after: time.Hour - time.Nanosecond, node: "edge-a"},
		{name: "at expiry", after: time.Hour, node: "edge-a", reason: ReasonExpiredToken},
		{name: "after expiry", after: 2 * time.Hour, node: "edge-a", reason: ReasonExpiredToken},
		{name: "other node", node: "edge-b", reason: ReasonWrongNode},
		{name: "wrong secret", node: "edge-a", token: func(tk pki.Token) string { return tk.ID + "." + strings.Repeat("x", 16) }, reason: ReasonInvalidToken},
		{name: "unknown id", node: "edge-a", token: func(tk pki.Token) string { return "zzzzzz." + tk.Secret }, reason: ReasonUnknownToken},
		{name: "malformed", node: "edge-a", token: func(tk pki.Token) string { return tk.String() + "x" }, reason: ReasonMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := start
			tokens, _ := fakeStore(&now)
			tok, info, err := tokens.Create(ctx, "edge-a", time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if !info.Expires.Equal(start.Add(time.Hour)) {
				t.Fatalf("expires %s, want %s", info.Expires, start.Add(time.Hour))
			}
			now = start.Add(tc.after)
			s := tok.String()
			if tc.token != nil {
				s = tc.token(tok)
			}
			got, err := tokens.Consume(ctx, s, tc.node, []byte("key 1"))
			if tc.reason == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got.Node != "edge-a" || got.UsedAt.IsZero() {
					t.Fatalf("consumed %+v", got)
				}
				// Once only, for one key; the same key again is a
				// retry after a lost answer.
				_, err = tokens.Consume(ctx, s, tc.node, []byte("key 2"))
				expectReason(t, err, ReasonReusedToken)
				again, err := tokens.Consume(ctx, s, tc.node, []byte("key 1"))
				if err != nil || !again.Retry {
					t.Fatalf("retry with the same key: %+v, %v", again, err)
				}
				_, err = tokens.Consume(ctx, s, "edge-b", []byte("key 1"))
				expectReason(t, err, ReasonReusedToken)
				return
			}
			expectReason(t, err, tc.reason)
			// A refusal leaves the token usable.
			now = start
			if _, err := tokens.Consume(ctx, tok.String(), "edge-a", []byte("key 3")); err != nil {
				t.Fatalf("the right use after a refused one: %v", err)
			}
		})
	}
}

func expectReason(t *testing.T, err error, reason string) {
	t.Helper()
	var ref *Refused
	if !errors.As(err, &ref) || ref.Reason != reason {
		t.Fatalf("got %v, want a %s refusal", err, reason)
	}
	if ref.Msg == "" || ref.Status < 400 || ref.Status >= 500 {
		t.Fatalf("refusal %+v lacks a message or a 4xx status", ref)
	}
}
