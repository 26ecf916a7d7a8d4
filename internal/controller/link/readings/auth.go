package readings

// Authentication and authorization delegated to the API server, as
// metrics-server and every aggregated API server do: the front proxy's
// client certificate (verified against the requestheader client CA the
// API server publishes in kube-system/extension-apiserver-authentication)
// vouches for the user named in its X-Remote-* headers; a bearer token is
// checked with a TokenReview; every request for readings is authorized
// with a SubjectAccessReview.

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	rv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
)

// AuthenticationConfigMap is where the API server publishes how its front
// proxy authenticates to aggregated API servers (in kube-system).
const AuthenticationConfigMap = "extension-apiserver-authentication"

// requestHeader is the front proxy's part of that ConfigMap.
type requestHeader struct {
	roots        *x509.CertPool
	allowedNames []string
	userHeaders  []string
	groupHeaders []string
	extraPrefix  []string
	uidHeaders   []string
}

// parseRequestHeader reads the ConfigMap's requestheader-* keys; nil when
// the API server has no front proxy configured.
func parseRequestHeader(cm *corev1.ConfigMap) (*requestHeader, error) {
	caPEM := cm.Data["requestheader-client-ca-file"]
	if caPEM == "" {
		return nil, nil
	}
	rh := &requestHeader{roots: x509.NewCertPool()}
	if !rh.roots.AppendCertsFromPEM([]byte(caPEM)) {
		return nil, errors.New("requestheader-client-ca-file holds no certificate")
	}
	for key, into := range map[string]*[]string{
		"requestheader-allowed-names":        &rh.allowedNames,
		"requestheader-username-headers":     &rh.userHeaders,
		"requestheader-group-headers":        &rh.groupHeaders,
		"requestheader-extra-headers-prefix": &rh.extraPrefix,
		"requestheader-uid-headers":          &rh.uidHeaders,
	} {
		if s := cm.Data[key]; s != "" {
			if err := json.Unmarshal([]byte(s), into); err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
		}
	}
	if len(rh.userHeaders) == 0 {
		return nil, errors.New("requestheader-username-headers is empty")
	}
	return rh, nil
}

// User is an authenticated user.
type User struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
}

// Auth authenticates and authorizes requests.
type Auth struct {
	ConfigMaps   corev1client.ConfigMapInterface // kube-system's
	TokenReviews authenticationv1client.TokenReviewInterface
	SARs         authorizationv1client.SubjectAccessReviewInterface
	// CacheTTL is how long a TokenReview's or a SubjectAccessReview's
	// answer is kept (10 s when zero, as the API server's webhooks do).
	CacheTTL time.Duration
	Log      logr.Logger

	rh       atomic.Pointer[requestHeader]
	loaded   atomic.Bool
	mu       sync.Mutex
	decision map[string]cached
}

type cached struct {
	until   time.Time
	allowed bool
	reason  string
	user    *User
}

// Start reads the front proxy's configuration now and every minute until
// ctx ends.
func (a *Auth) Start(ctx context.Context) error {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		if err := a.load(ctx); err != nil && ctx.Err() == nil {
			a.Log.Error(err, "reading the API server's front proxy configuration", "configMap", "kube-system/"+AuthenticationConfigMap)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (a *Auth) load(ctx context.Context) error {
	cm, err := a.ConfigMaps.Get(ctx, AuthenticationConfigMap, metav1.GetOptions{})
	if err != nil {
		return err
	}
	rh, err := parseRequestHeader(cm)
	if err != nil {
		return err
	}
	a.rh.Store(rh)
	a.loaded.Store(true)
	return nil
}

// Loaded says whether the front proxy's configuration was read.
func (a *Auth) Loaded() bool { return a.loaded.Load() }

// errUnauthenticated: no credential this server accepts.
var errUnauthenticated = errors.New("unauthenticated")

// Authenticate names the request's user: the front proxy's headers under
// its verified certificate, else a bearer token's TokenReview.
func (a *Auth) Authenticate(r *http.Request) (*User, error) {
	if u, ok := a.frontProxy(r); ok {
		return u, nil
	}
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && tok != "" && a.TokenReviews != nil {
		return a.reviewToken(r.Context(), tok)
	}
	return nil, errUnauthenticated
}

// frontProxy: a client certificate of the requestheader CA, of an allowed
// name, and a user in its headers.
func (a *Auth) frontProxy(r *http.Request) (*User, bool) {
	rh := a.rh.Load()
	if rh == nil || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil, false
	}
	leaf := r.TLS.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: rh.roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, false
	}
	if len(rh.allowedNames) > 0 && !slices.Contains(rh.allowedNames, leaf.Subject.CommonName) {
		return nil, false
	}
	u := &User{}
	for _, h := range rh.userHeaders {
		if v := r.Header.Get(h); v != "" {
			u.Name = v
			break
		}
	}
	if u.Name == "" {
		return nil, false
	}
	for _, h := range rh.uidHeaders {
		if v := r.Header.Get(h); v != "" {
			u.UID = v
			break
		}
	}
	for _, h := range rh.groupHeaders {
		u.Groups = append(u.Groups, r.Header.Values(h)...)
	}
	for _, prefix := range rh.extraPrefix {
		for h, vs := range r.Header {
			if k, ok := cutPrefixFold(h, prefix); ok && k != "" {
				if u.Extra == nil {
					u.Extra = map[string][]string{}
				}
				// Keys are lowercased and %-escaped by the front proxy.
				key := strings.ToLower(unescape(k))
				u.Extra[key] = append(u.Extra[key], vs...)
			}
		}
	}
	return u, true
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return "", false
}

// unescape undoes the %-escaping of extra keys in header names.
func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			var v byte
			if _, err := fmt.Sscanf(s[i+1:i+3], "%02x", &v); err == nil {
				b.WriteByte(v)
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (a *Auth) ttl() time.Duration {
	if a.CacheTTL > 0 {
		return a.CacheTTL
	}
	return 10 * time.Second
}

func (a *Auth) cachedDecision(key string) (cached, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.decision[key]
	if !ok || time.Now().After(c.until) {
		return cached{}, false
	}
	return c, true
}

func (a *Auth) remember(key string, c cached) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.decision == nil {
		a.decision = map[string]cached{}
	}
	now := time.Now()
	if len(a.decision) > 10000 {
		for k, v := range a.decision {
			if now.After(v.until) {
				delete(a.decision, k)
			}
		}
	}
	c.until = now.Add(a.ttl())
	a.decision[key] = c
}

func (a *Auth) reviewToken(ctx context.Context, token string) (*User, error) {
	key := "token\x00" + token
	if c, ok := a.cachedDecision(key); ok {
		if c.user == nil {
			return nil, errUnauthenticated
		}
		return c.user, nil
	}
	tr, err := a.TokenReviews.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("reviewing the token: %w", err)
	}
	if !tr.Status.Authenticated {
		a.remember(key, cached{})
		return nil, errUnauthenticated
	}
	u := &User{Name: tr.Status.User.Username, UID: tr.Status.User.UID, Groups: tr.Status.User.Groups}
	for k, v := range tr.Status.User.Extra {
		if u.Extra == nil {
			u.Extra = map[string][]string{}
		}
		u.Extra[k] = v
	}
	a.remember(key, cached{user: u})
	return u, nil
}

// Attributes is what a request asks for.
type Attributes struct {
	Verb, Namespace, Name string
}

// Authorize asks the API server whether u may do attrs on DeviceReadings;
// reason says why not.
func (a *Auth) Authorize(ctx context.Context, u *User, attrs Attributes) (allowed bool, reason string, err error) {
	groups := slices.Clone(u.Groups)
	slices.Sort(groups)
	key := strings.Join([]string{"sar", u.Name, u.UID, strings.Join(groups, ","), fmt.Sprint(u.Extra), attrs.Verb, attrs.Namespace, attrs.Name}, "\x00")
	if c, ok := a.cachedDecision(key); ok {
		return c.allowed, c.reason, nil
	}
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = v
	}
	sar, err := a.SARs.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.Name, UID: u.UID, Groups: u.Groups, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: attrs.Namespace, Verb: attrs.Verb, Group: rv1.Group, Version: rv1.Version, Resource: rv1.Resource, Name: attrs.Name,
		},
	}}, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("asking the API server to authorize: %w", err)
	}
	a.remember(key, cached{allowed: sar.Status.Allowed, reason: sar.Status.Reason})
	return sar.Status.Allowed, sar.Status.Reason, nil
}
