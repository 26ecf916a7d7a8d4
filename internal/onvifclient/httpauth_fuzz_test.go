package onvifclient

import (
	"strings"
	"testing"
)

// FuzzChallenge feeds any WWW-Authenticate values a camera (or anything on
// its LAN answering in its place) may send: parsing never panics, a Digest
// challenge taken is of a supported algorithm with a nonce, and the
// Authorization header answering it carries the challenge's realm, nonce
// and opaque back as they were sent, whatever quotes or backslashes they
// hold.
func FuzzChallenge(f *testing.F) {
	for _, seed := range []string{
		`Digest realm="cam", nonce="abc", qop="auth", algorithm=MD5`,
		`Digest realm="a\"b\\c", nonce="n,1", opaque="o", algorithm=SHA-256-sess`,
		`Basic realm="x"`, `Digest nonce=`, `Digest realm="unterminated`, `digest qop="auth-int", nonce="n"`,
	} {
		f.Add(seed, "Basic")
	}
	f.Fuzz(func(t *testing.T, first, second string) {
		a := parseChallenge([]string{first, second})
		if a == nil || !a.digest {
			return
		}
		if a.newHash() == nil || a.nonce == "" {
			t.Fatalf("took a challenge without a nonce or of algorithm %q", a.algorithm)
		}
		a.cnonce = func() string { return "c0ffee" }
		h := a.authorization("user", "secret", "POST", "/onvif/device_service")
		scheme, rest, _ := strings.Cut(h, " ")
		p := authParams(rest)
		if scheme != "Digest" || p["realm"] != a.realm || p["nonce"] != a.nonce || p["opaque"] != a.opaque || p["username"] != "user" {
			t.Fatalf("header %q reads back as %v; want realm %q nonce %q opaque %q", h, p, a.realm, a.nonce, a.opaque)
		}
	})
}
