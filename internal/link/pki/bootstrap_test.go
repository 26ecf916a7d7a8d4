package pki

import (
	"strings"
	"testing"
	"time"
)

func TestParseToken(t *testing.T) {
	for _, tc := range []struct {
		in     string
		id     string
		secret string
	}{
		{in: "abcdef.0123456789abcdef", id: "abcdef", secret: "0123456789abcdef"},
		{in: "a1b2c3.zzzzzzzzzzzzzzzz", id: "a1b2c3", secret: "zzzzzzzzzzzzzzzz"},
		{in: "ABCDEF.0123456789abcdef"},  // upper case
		{in: "abcde.0123456789abcdef"},   // short id
		{in: "abcdefg.0123456789abcdef"}, // long id
		{in: "abcdef.0123456789abcde"},   // short secret
		{in: "abcdef.0123456789abcdef0"}, // long secret
		{in: "abcdef0123456789abcdef"},   // no dot
		{in: "abcdef:0123456789abcdef"},  // wrong separator
		{in: " abcdef.0123456789abcdef"}, // padding
		{in: "abcdef.0123456789abcd-f"},
		{in: ""},
	} {
		tok, err := ParseToken(tc.in)
		if tc.id == "" {
			if err == nil {
				t.Errorf("ParseToken(%q) = %+v, want an error", tc.in, tok)
			} else if tc.in != "" && strings.Contains(err.Error(), tc.in) {
				t.Errorf("ParseToken(%q) error echoes the token: %v", tc.in, err)
			}
			continue
		}
		if err != nil || tok.ID != tc.id || tok.Secret != tc.secret {
			t.Errorf("ParseToken(%q) = %+v, %v", tc.in, tok, err)
		}
		if tok.String() != tc.in {
			t.Errorf("String() = %q, want %q", tok.String(), tc.in)
		}
	}
}

func TestNewTokenRoundTripsAndVaries(t *testing.T) {
	seen := map[string]bool{}
	counts := map[rune]int{}
	for range 20000 {
		tok, err := NewToken()
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseToken(tok.String())
		if err != nil || back != tok {
			t.Fatalf("NewToken made %q, which parses to %+v, %v", tok, back, err)
		}
		if seen[tok.String()] {
			t.Fatalf("token %q drawn twice", tok)
		}
		seen[tok.String()] = true
		for _, r := range tok.ID + tok.Secret {
			counts[r]++
		}
	}
	// 440,000 characters over 36 symbols: 12,222 each, standard deviation
	// about 109. The bounds are six deviations out; a plain byte%36 without
	// rejection would draw its first four symbols about 13,750 times.
	if len(counts) != 36 {
		t.Fatalf("%d distinct characters drawn, want 36", len(counts))
	}
	for r, n := range counts {
		if n < 11570 || n > 12870 {
			t.Errorf("character %q drawn %d times, want about 12222", r, n)
		}
	}
}

func TestCAPin(t *testing.T) {
	ca, err := NewCA("pin test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("pin test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pin := CAPin(ca.Cert)
	if !strings.HasPrefix(pin, "sha256:") || len(pin) != len("sha256:")+64 {
		t.Fatalf("pin %q", pin)
	}
	parsed, err := ParsePin(strings.ToUpper(pin[:7]) + strings.ToUpper(pin[7:]))
	if err != nil || parsed != pin {
		t.Fatalf("ParsePin(upper case) = %q, %v", parsed, err)
	}
	if !MatchesPin(ca.Cert, pin) {
		t.Error("a CA does not match its own pin")
	}
	if MatchesPin(other.Cert, pin) {
		t.Error("another CA with the same name matches the pin")
	}
	for _, bad := range []string{"", pin[7:], "sha1:" + pin[7:], pin[:len(pin)-2], pin + "00", "sha256:" + strings.Repeat("g", 64)} {
		if _, err := ParsePin(bad); err == nil {
			t.Errorf("ParsePin(%q) accepted", bad)
		}
	}
}
