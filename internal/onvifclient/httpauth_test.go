package onvifclient

import (
	"strings"
	"testing"
)

// RFC 7616 section 3.9.1's example: the same request answered with MD5 and
// with SHA-256.
func TestDigestRFC7616(t *testing.T) {
	const challenge = `realm="http-auth@example.org", qop="auth, auth-int", nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"`
	for alg, want := range map[string]string{
		"MD5":     "8ca523f5e9506fed4657c9700eebdbec",
		"SHA-256": "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1",
	} {
		a := parseChallenge([]string{`Basic realm="x"`, "Digest " + challenge + ", algorithm=" + alg})
		if a == nil || !a.digest || !a.qop {
			t.Fatalf("%s: challenge parsed as %+v", alg, a)
		}
		a.cnonce = func() string { return "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ" }
		h := a.authorization("Mufasa", "Circle of Life", "GET", "/dir/index.html")
		if !strings.Contains(h, `response="`+want+`"`) {
			t.Errorf("%s: %s, want response %s", alg, h, want)
		}
		for _, part := range []string{`username="Mufasa"`, `nc=00000001`, `qop=auth,`, `opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"`, `uri="/dir/index.html"`} {
			if !strings.Contains(h, part) {
				t.Errorf("%s: %s lacks %s", alg, h, part)
			}
		}
	}
}

func TestChallenges(t *testing.T) {
	if a := parseChallenge([]string{`Basic realm="go2rtc"`}); a == nil || a.digest {
		t.Errorf("Basic parsed as %+v", a)
	} else if got := a.authorization("admin", "secret", "POST", "/onvif/device_service"); got != "Basic YWRtaW46c2VjcmV0" {
		t.Errorf("Basic header %q", got)
	}
	for _, v := range []string{`Negotiate`, `Digest realm="r", nonce="n", qop="auth-int"`, `Digest realm="r", nonce="n", algorithm=SHA-512-256`, `Digest realm="r"`} {
		if a := parseChallenge([]string{v}); a != nil {
			t.Errorf("%s parsed as %+v, want unsupported", v, a)
		}
	}
	a := parseChallenge([]string{`Digest realm="r", nonce="n1"`})
	if b := parseChallenge([]string{`Digest realm="r", nonce="n1"`}); !a.same(b) {
		t.Error("the same challenge is not the same")
	}
	if b := parseChallenge([]string{`Digest realm="r", nonce="n2", stale=true`}); a.same(b) || !b.stale {
		t.Errorf("a new nonce: %+v", b)
	}
}
