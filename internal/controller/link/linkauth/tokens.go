package linkauth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dowse-dev/dowse/internal/link/pki"
)

// A bootstrap token is kept as a Secret, like kubeadm's, with two changes:
// its own Secret type, so that the API server's bootstrap-token
// authenticator and kube-controller-manager's token cleaner never mistake it
// for a cluster join token; and only a hash of the secret part, so that
// whoever can read Secrets (a backup, a dashboard) cannot use it.
const (
	// TokenSecretType is the type of every bootstrap token Secret.
	TokenSecretType corev1.SecretType = "dowse.dev/link-bootstrap-token"
	// TokenSecretPrefix plus the token id names the Secret.
	TokenSecretPrefix = "dowse-link-token-"
	// LabelToken marks token Secrets, so that they are listable with
	// kubectl get secrets -l dowse.dev/link-bootstrap-token.
	LabelToken = "dowse.dev/link-bootstrap-token"
	// LabelNode names the node a token is for, when the name fits a label
	// value (the Secret's data always has it).
	LabelNode = "dowse.dev/node"

	keyID         = "token-id"
	keySecretHash = "token-secret-sha256"
	keyNode       = "node"
	keyExpiration = "expiration"
	keyUsedAt     = "used-at"
	keyUsedByKey  = "used-by-key-sha256"
)

// TokenInfo is what the store knows of a token, without its secret.
type TokenInfo struct {
	ID      string
	Node    string
	Expires time.Time
	// UsedAt is zero while the token is unused.
	UsedAt time.Time
	// Retry is set by Consume when the key that used the token asked again.
	Retry bool
}

// Tokens stores bootstrap tokens as Secrets in one namespace.
type Tokens struct {
	secrets SecretClient
	now     func() time.Time
}

// NewTokens stores tokens through secrets (a namespaced Secret client).
func NewTokens(secrets SecretClient) *Tokens {
	return &Tokens{secrets: secrets, now: time.Now}
}

// Create mints a token for node that expires after ttl. The returned token
// is the only copy of its secret part: print it once, it cannot be read
// back. Not idempotent: each call makes a new token.
func (t *Tokens) Create(ctx context.Context, node string, ttl time.Duration) (pki.Token, TokenInfo, error) {
	if err := pki.ValidateNodeName(node); err != nil {
		return pki.Token{}, TokenInfo{}, err
	}
	if ttl <= 0 {
		return pki.Token{}, TokenInfo{}, fmt.Errorf("token ttl must be positive, got %s", ttl)
	}
	// Expirations are stored to the second (RFC 3339, as kubeadm does);
	// rounding down keeps a token from outliving its ttl.
	expires := t.now().Add(ttl).UTC().Truncate(time.Second)
	labels := map[string]string{LabelToken: "true"}
	if len(validation.IsValidLabelValue(node)) == 0 {
		labels[LabelNode] = node
	}
	// An id collision (one in 36^6 per pair of live tokens) shows as
	// AlreadyExists; drawing again is cheaper than listing first.
	for range 3 {
		tok, err := pki.NewToken()
		if err != nil {
			return pki.Token{}, TokenInfo{}, err
		}
		_, err = t.secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: TokenSecretPrefix + tok.ID, Labels: labels},
			Type:       TokenSecretType,
			Data: map[string][]byte{
				keyID:         []byte(tok.ID),
				keySecretHash: []byte(hashSecret(tok.Secret)),
				keyNode:       []byte(node),
				keyExpiration: []byte(expires.Format(time.RFC3339)),
			},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return pki.Token{}, TokenInfo{}, fmt.Errorf("storing bootstrap token: %w", err)
		}
		return tok, TokenInfo{ID: tok.ID, Node: node, Expires: expires}, nil
	}
	return pki.Token{}, TokenInfo{}, errors.New("could not find a free token id")
}

// List returns every token Secret's information, used or not.
func (t *Tokens) List(ctx context.Context) ([]TokenInfo, error) {
	list, err := t.secrets.List(ctx, metav1.ListOptions{LabelSelector: LabelToken})
	if err != nil {
		return nil, fmt.Errorf("listing bootstrap tokens: %w", err)
	}
	var out []TokenInfo
	for i := range list.Items {
		if info, err := tokenInfo(&list.Items[i]); err == nil {
			out = append(out, info)
		}
	}
	return out, nil
}

// Refused is returned for a request the cloud will not grant; retrying it
// unchanged cannot succeed. Reason is a short constant (a metric label),
// Error the explanation for the operator.
type Refused struct {
	Reason string
	Status int
	Msg    string
}

func (r *Refused) Error() string { return r.Msg }

// Reasons for refusing.
const (
	ReasonMalformed      = "malformed"        // request or token not parseable
	ReasonUnknownToken   = "unknown_token"    // no such token (never made, or expired and removed)
	ReasonInvalidToken   = "invalid_token"    // the secret part does not match
	ReasonExpiredToken   = "expired_token"    // past its expiration
	ReasonReusedToken    = "reused_token"     // already traded for a certificate
	ReasonWrongNode      = "wrong_node"       // the CSR names a node other than the token's or certificate's
	ReasonBadClientCert  = "bad_client_cert"  // renew without a valid certificate from the link CA
	ReasonNodeNotAllowed = "node_not_allowed" // renew for a node Config.NodeAllowed rejects
	ReasonRateLimited    = "rate_limited"     // over Config.RequestRate; retryable (HTTP 429)
	// Service account bootstrap (Config.TokenReviews).
	ReasonInvalidSAToken  = "invalid_service_account_token"   // the API server does not authenticate it (expired, wrong audience, pod gone)
	ReasonSANotAllowed    = "service_account_not_allowed"     // not one of Config.AgentServiceAccounts
	ReasonSATokenNotBound = "service_account_token_not_bound" // not bound to a pod on a node
	ReasonSABootstrapOff  = "service_account_bootstrap_off"   // this cloud takes bootstrap tokens only
)

func refuse(reason string, status int, format string, args ...any) *Refused {
	return &Refused{Reason: reason, Status: status, Msg: fmt.Sprintf(format, args...)}
}

// Consume checks token and marks it used, for a CSR that names csrNode and
// carries the public key csrKey (its DER SubjectPublicKeyInfo).
//
// Exactly one key ever gets a token: it is marked used with an Update that
// carries the resourceVersion read, so of several concurrent uses all but
// one get a Conflict and are refused. The same key may use it again until
// it expires: that is the edge retrying a bootstrap whose answer the
// network lost (the edge keeps its key across retries), and it gains
// nothing else, since a certificate for that key is useless without the
// private key. A token is not consumed when it is refused (a CSR for
// another node leaves it usable by the right edge). A used token stays,
// marked, until the cleaner removes it after its expiration, so that a
// reuse is reported as such rather than as unknown. Errors other than
// *Refused are the API server's and retryable.
func (t *Tokens) Consume(ctx context.Context, token, csrNode string, csrKey []byte) (TokenInfo, error) {
	tok, err := pki.ParseToken(token)
	if err != nil {
		return TokenInfo{}, refuse(ReasonMalformed, http.StatusBadRequest, "%v", err)
	}
	s, err := t.secrets.Get(ctx, TokenSecretPrefix+tok.ID, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return TokenInfo{}, refuse(ReasonUnknownToken, http.StatusUnauthorized, "bootstrap token %s is unknown: it was never created, or it expired and was removed", tok.ID)
	}
	if err != nil {
		return TokenInfo{}, fmt.Errorf("reading bootstrap token %s: %w", tok.ID, err)
	}
	info, err := tokenInfo(s)
	if err != nil {
		return TokenInfo{}, refuse(ReasonUnknownToken, http.StatusUnauthorized, "bootstrap token %s is unknown: %v", tok.ID, err)
	}
	if !secretMatches(tok.Secret, s.Data[keySecretHash]) {
		return TokenInfo{}, refuse(ReasonInvalidToken, http.StatusUnauthorized, "bootstrap token %s: the secret part is wrong", tok.ID)
	}
	// Expiry before use: an old used token reads as expired, the more
	// useful thing to tell an operator who kept a stale token around.
	if now := t.now(); !now.Before(info.Expires) {
		return TokenInfo{}, refuse(ReasonExpiredToken, http.StatusUnauthorized, "bootstrap token %s expired at %s: create a new one with dowsectl token create", tok.ID, info.Expires.Format(time.RFC3339))
	}
	keyHash := sha256.Sum256(csrKey)
	key := hex.EncodeToString(keyHash[:])
	if !info.UsedAt.IsZero() {
		if string(s.Data[keyUsedByKey]) == key && csrNode == info.Node {
			info.Retry = true
			return info, nil
		}
		return TokenInfo{}, refuse(ReasonReusedToken, http.StatusUnauthorized, "bootstrap token %s was already used at %s: a token bootstraps one node once", tok.ID, info.UsedAt.Format(time.RFC3339))
	}
	if csrNode != info.Node {
		return TokenInfo{}, refuse(ReasonWrongNode, http.StatusForbidden, "bootstrap token %s is for node %q, but the certificate request names node %q", tok.ID, info.Node, csrNode)
	}
	used := t.now().UTC()
	s = s.DeepCopy()
	s.Data[keyUsedAt] = []byte(used.Format(time.RFC3339Nano))
	s.Data[keyUsedByKey] = []byte(key)
	// Update sends the resourceVersion we read: the precondition that makes
	// two racing uses fail for all but one.
	if _, err := t.secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return TokenInfo{}, refuse(ReasonReusedToken, http.StatusUnauthorized, "bootstrap token %s was used by another request at the same time", tok.ID)
		}
		return TokenInfo{}, fmt.Errorf("marking bootstrap token %s used: %w", tok.ID, err)
	}
	info.UsedAt = used
	return info, nil
}

// DeleteExpired removes the Secrets of tokens past their expiration (used or
// not) and of token Secrets it cannot read. Idempotent; concurrent cleaners
// are harmless.
func (t *Tokens) DeleteExpired(ctx context.Context) (int, error) {
	list, err := t.secrets.List(ctx, metav1.ListOptions{LabelSelector: LabelToken})
	if err != nil {
		return 0, fmt.Errorf("listing bootstrap tokens: %w", err)
	}
	now, n := t.now(), 0
	for i := range list.Items {
		s := &list.Items[i]
		if info, err := tokenInfo(s); err == nil && now.Before(info.Expires) {
			continue
		}
		err := t.secrets.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return n, fmt.Errorf("deleting expired bootstrap token %s: %w", s.Name, err)
		}
		if err == nil {
			n++
		}
	}
	return n, nil
}

func tokenInfo(s *corev1.Secret) (TokenInfo, error) {
	if s.Type != TokenSecretType {
		return TokenInfo{}, fmt.Errorf("secret %s has type %q, not %q", s.Name, s.Type, TokenSecretType)
	}
	info := TokenInfo{ID: string(s.Data[keyID]), Node: string(s.Data[keyNode])}
	if TokenSecretPrefix+info.ID != s.Name {
		return TokenInfo{}, fmt.Errorf("secret %s holds token id %q", s.Name, info.ID)
	}
	exp, err := time.Parse(time.RFC3339, string(s.Data[keyExpiration]))
	if err != nil {
		return TokenInfo{}, fmt.Errorf("secret %s: expiration: %w", s.Name, err)
	}
	info.Expires = exp
	if u := s.Data[keyUsedAt]; len(u) > 0 {
		if info.UsedAt, err = time.Parse(time.RFC3339Nano, string(u)); err != nil {
			return TokenInfo{}, fmt.Errorf("secret %s: used-at: %w", s.Name, err)
		}
	}
	return info, nil
}

// hashSecret is the stored form of a token's secret part. A fast unsalted
// hash is enough here, unlike for passwords: the secret is ~82 random bits,
// so there is no dictionary to try and no feasible brute force.
func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// secretMatches compares in constant time, so that response timing tells an
// attacker nothing about how much of a guess was right.
func secretMatches(secret string, storedHash []byte) bool {
	return subtle.ConstantTimeCompare([]byte(hashSecret(secret)), storedHash) == 1
}
