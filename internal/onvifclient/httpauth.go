package onvifclient

import (
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash"
	"strings"
)

// httpAuth is the HTTP authentication a camera asked for with a 401: Basic,
// or Digest (RFC 7616: MD5 or SHA-256, qop auth or none).
type httpAuth struct {
	digest               bool
	realm, nonce, opaque string
	algorithm            string // MD5, MD5-sess, SHA-256, SHA-256-sess
	qop                  bool   // qop=auth offered
	stale                bool
	nc                   int
	cnonce               func() string // test hook; random when nil
}

// parseChallenge picks Digest over Basic from a 401's WWW-Authenticate
// values; nil when it names neither (or a Digest variant not supported).
func parseChallenge(values []string) *httpAuth {
	var basic *httpAuth
	for _, v := range values {
		scheme, rest, _ := strings.Cut(strings.TrimSpace(v), " ")
		switch strings.ToLower(scheme) {
		case "basic":
			basic = &httpAuth{}
		case "digest":
			p := authParams(rest)
			a := &httpAuth{digest: true, realm: p["realm"], nonce: p["nonce"], opaque: p["opaque"], algorithm: p["algorithm"],
				stale: strings.EqualFold(p["stale"], "true")}
			if a.algorithm == "" {
				a.algorithm = "MD5"
			}
			if a.newHash() == nil || a.nonce == "" {
				continue
			}
			if q, ok := p["qop"]; ok {
				for _, o := range strings.Split(q, ",") {
					a.qop = a.qop || strings.TrimSpace(o) == "auth"
				}
				if !a.qop {
					continue // auth-int only
				}
			}
			return a
		}
	}
	return basic
}

// same says whether b is the challenge a answered (so a second 401 means
// the credentials are wrong, not that the nonce moved on).
func (a *httpAuth) same(b *httpAuth) bool {
	return a.digest == b.digest && a.realm == b.realm && a.nonce == b.nonce
}

func (a *httpAuth) newHash() hash.Hash {
	switch strings.ToUpper(strings.TrimSuffix(strings.ToUpper(a.algorithm), "-SESS")) {
	case "MD5":
		return md5.New()
	case "SHA-256":
		return sha256.New()
	}
	return nil
}

func (a *httpAuth) h(s string) string {
	h := a.newHash()
	h.Write([]byte(s))
	return hex.EncodeToString(h.Sum(nil))
}

// authorization is the Authorization header of one request.
func (a *httpAuth) authorization(user, password, method, uri string) string {
	if !a.digest {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
	}
	a.nc++
	nc := fmt.Sprintf("%08x", a.nc)
	cnonce := ""
	if a.cnonce != nil {
		cnonce = a.cnonce()
	} else {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		cnonce = hex.EncodeToString(b)
	}
	ha1 := a.h(user + ":" + a.realm + ":" + password)
	if strings.HasSuffix(strings.ToUpper(a.algorithm), "-SESS") {
		ha1 = a.h(ha1 + ":" + a.nonce + ":" + cnonce)
	}
	ha2 := a.h(method + ":" + uri)
	var resp string
	if a.qop {
		resp = a.h(ha1 + ":" + a.nonce + ":" + nc + ":" + cnonce + ":auth:" + ha2)
	} else {
		resp = a.h(ha1 + ":" + a.nonce + ":" + ha2)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `Digest username=%s, realm=%s, nonce=%s, uri=%s, algorithm=%s, response=%s`,
		quote(user), quote(a.realm), quote(a.nonce), quote(uri), a.algorithm, quote(resp))
	if a.opaque != "" {
		fmt.Fprintf(&b, `, opaque=%s`, quote(a.opaque))
	}
	if a.qop {
		fmt.Fprintf(&b, `, qop=auth, nc=%s, cnonce=%s`, nc, quote(cnonce))
	}
	return b.String()
}

func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// authParams parses a challenge's comma-separated key=value or
// key="quoted value" parameters.
func authParams(s string) map[string]string {
	p := map[string]string{}
	for s = strings.TrimSpace(s); s != ""; {
		k, rest, ok := strings.Cut(s, "=")
		if !ok {
			break
		}
		k = strings.ToLower(strings.TrimSpace(strings.TrimLeft(k, ", ")))
		rest = strings.TrimSpace(rest)
		var v string
		if strings.HasPrefix(rest, `"`) {
			var sb strings.Builder
			i := 1
			for ; i < len(rest) && rest[i] != '"'; i++ {
				if rest[i] == '\\' && i+1 < len(rest) {
					i++
				}
				sb.WriteByte(rest[i])
			}
			v, rest = sb.String(), rest[min(i+1, len(rest)):]
		} else {
			v, rest, _ = strings.Cut(rest, ",")
			v = strings.TrimSpace(v)
		}
		p[k] = v
		s = strings.TrimLeft(strings.TrimSpace(rest), ",")
	}
	return p
}
