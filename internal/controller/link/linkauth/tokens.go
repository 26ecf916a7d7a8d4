package linkauth

import (
	"context"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/internal/bootstrap"
	"github.com/dowse-dev/dowse/internal/link/pki"
)

// Tokens is the bootstrap token store (internal/bootstrap: Create, List,
// DeleteExpired) with Consume, the one use the endpoint makes of a token.
type Tokens struct {
	*bootstrap.Tokens
	secrets bootstrap.SecretClient
	now     func() time.Time
}

// NewTokens stores tokens through secrets (a namespaced Secret client).
func NewTokens(secrets bootstrap.SecretClient) *Tokens {
	t := &Tokens{secrets: secrets, now: time.Now}
	t.Tokens = bootstrap.NewTokens(secrets, func() time.Time { return t.now() })
	return t
}

// Consumed is a token as Consume found it.
type Consumed struct {
	bootstrap.TokenInfo
	// Retry is set when the key that used the token asked again.
	Retry bool
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
func (t *Tokens) Consume(ctx context.Context, token, csrNode string, csrKey []byte) (Consumed, error) {
	tok, err := pki.ParseToken(token)
	if err != nil {
		return Consumed{}, refuse(ReasonMalformed, http.StatusBadRequest, "%v", err)
	}
	s, err := t.secrets.Get(ctx, bootstrap.TokenSecretPrefix+tok.ID, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Consumed{}, refuse(ReasonUnknownToken, http.StatusUnauthorized, "bootstrap token %s is unknown: it was never created, or it expired and was removed", tok.ID)
	}
	if err != nil {
		return Consumed{}, fmt.Errorf("reading bootstrap token %s: %w", tok.ID, err)
	}
	parsed, err := bootstrap.ParseTokenSecret(s)
	if err != nil {
		return Consumed{}, refuse(ReasonUnknownToken, http.StatusUnauthorized, "bootstrap token %s is unknown: %v", tok.ID, err)
	}
	info := Consumed{TokenInfo: parsed}
	if !bootstrap.TokenSecretMatches(s, tok.Secret) {
		return Consumed{}, refuse(ReasonInvalidToken, http.StatusUnauthorized, "bootstrap token %s: the secret part is wrong", tok.ID)
	}
	// Expiry before use: an old used token reads as expired, the more
	// useful thing to tell an operator who kept a stale token around.
	if now := t.now(); !now.Before(info.Expires) {
		return Consumed{}, refuse(ReasonExpiredToken, http.StatusUnauthorized, "bootstrap token %s expired at %s: create a new one with dowsectl token create", tok.ID, info.Expires.Format(time.RFC3339))
	}
	if !info.UsedAt.IsZero() {
		if info.UsedBy(csrKey) && csrNode == info.Node {
			info.Retry = true
			return info, nil
		}
		return Consumed{}, refuse(ReasonReusedToken, http.StatusUnauthorized, "bootstrap token %s was already used at %s: a token bootstraps one node once", tok.ID, info.UsedAt.Format(time.RFC3339))
	}
	if csrNode != info.Node {
		return Consumed{}, refuse(ReasonWrongNode, http.StatusForbidden, "bootstrap token %s is for node %q, but the certificate request names node %q", tok.ID, info.Node, csrNode)
	}
	used := t.now().UTC()
	s = bootstrap.MarkTokenUsed(s, used, csrKey)
	// Update sends the resourceVersion we read: the precondition that makes
	// two racing uses fail for all but one.
	if _, err := t.secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return Consumed{}, refuse(ReasonReusedToken, http.StatusUnauthorized, "bootstrap token %s was used by another request at the same time", tok.ID)
		}
		return Consumed{}, fmt.Errorf("marking bootstrap token %s used: %w", tok.ID, err)
	}
	info.UsedAt = used
	return info, nil
}
