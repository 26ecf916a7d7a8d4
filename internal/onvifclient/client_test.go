package onvifclient

import (
	"context"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestSecurityHeaderDigest(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := SecurityHeader("ad<min", "secret", now)
	nonce, _ := base64.StdEncoding.DecodeString(between(h, `#Base64Binary">`, "<"))
	sum := sha1.Sum(append(append(nonce, []byte("2026-01-02T03:04:05.000Z")...), []byte("secret")...))
	if got := between(h, `#PasswordDigest">`, "<"); got != base64.StdEncoding.EncodeToString(sum[:]) {
		t.Errorf("digest %q is not SHA1(nonce + created + password)", got)
	}
	if !strings.Contains(h, "<wsse:Username>ad&lt;min</wsse:Username>") {
		t.Errorf("user name not escaped: %s", h)
	}
}

func between(s, a, b string) string {
	i := strings.Index(s, a)
	if i < 0 {
		return ""
	}
	s = s[i+len(a):]
	j := strings.Index(s, b)
	if j < 0 {
		return ""
	}
	return s[:j]
}

// TestErrors: what a camera's refusals become. (Real cameras and a real
// Digest proxy are in the handler's and the mapper's tests.)
func TestErrors(t *testing.T) {
	answers := map[string]func(w http.ResponseWriter){
		"/fault": func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:ter="http://www.onvif.org/ver10/error"><s:Body><s:Fault><s:Code><s:Value>s:Sender</s:Value><s:Subcode><s:Value>ter:NotAuthorized</s:Value></s:Subcode></s:Code><s:Reason><s:Text xml:lang="en">Sender not Authorized</s:Text></s:Reason></s:Fault></s:Body></s:Envelope>`))
		},
		"/basic": func(w http.ResponseWriter) {
			w.Header().Set("WWW-Authenticate", `Basic realm="cam"`)
			w.WriteHeader(http.StatusUnauthorized)
		},
		"/busy": func(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) },
		"/bad":  func(w http.ResponseWriter) { _, _ = w.Write([]byte(`<a><b></a>`)) },
	}
	auths := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			auths++
		}
		answers[r.URL.Path](w)
	}))
	defer srv.Close()
	c := New(Options{Timeout: 2 * time.Second}).WithCredentials("admin", "wrong")
	ctx := context.Background()
	var e *Error
	if _, err := c.Call(ctx, srv.URL+"/fault", `<tds:GetDeviceInformation/>`); !errors.Is(err, ErrUnauthorized) || !errors.As(err, &e) || !e.Permanent() || !strings.Contains(err.Error(), "ter:NotAuthorized") {
		t.Errorf("NotAuthorized fault: %v", err)
	}
	if _, err := c.Call(ctx, srv.URL+"/basic", `<tds:GetDeviceInformation/>`); !errors.Is(err, ErrUnauthorized) || auths != 1 || !strings.Contains(err.Error(), `user "admin"`) {
		t.Errorf("Basic refused (%d answers with Authorization): %v", auths, err)
	}
	if _, err := c.Call(ctx, srv.URL+"/busy", ``); !errors.As(err, &e) || e.Permanent() || errors.Is(err, ErrUnauthorized) {
		t.Errorf("503: %v", err)
	}
	if _, err := c.Call(ctx, srv.URL+"/bad", ``); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("malformed: %v", err)
	}
	if _, err := New(Options{}).Call(ctx, srv.URL+"/basic", ``); !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "wants credentials") {
		t.Errorf("no credentials: %v", err)
	}
}
