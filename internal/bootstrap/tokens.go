package bootstrap

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
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

// TokenInfo is what a token Secret says of its token, without the secret.
type TokenInfo struct {
	ID      string
	Node    string
	Expires time.Time
	// UsedAt is zero while the token is unused.
	UsedAt time.Time
	// usedByKey is the hash of the public key the token was used for.
	usedByKey string
}

// UsedBy tells whether the token was used for key (a DER
// SubjectPublicKeyInfo), as MarkTokenUsed recorded it.
func (i TokenInfo) UsedBy(key []byte) bool {
	return !i.UsedAt.IsZero() && i.usedByKey == keyHash(key)
}

// TokenSecret is the Secret that keeps tok for node until expires (stored
// to the second, as kubeadm does): its name, type and labels, and only a
// hash of the secret part. ParseTokenSecret reads it back.
func TokenSecret(tok pki.Token, node string, expires time.Time) *corev1.Secret {
	labels := map[string]string{LabelToken: "true"}
	if len(validation.IsValidLabelValue(node)) == 0 {
		labels[LabelNode] = node
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: TokenSecretPrefix + tok.ID, Labels: labels},
		Type:       TokenSecretType,
		Data: map[string][]byte{
			keyID:         []byte(tok.ID),
			keySecretHash: []byte(hashSecret(tok.Secret)),
			keyNode:       []byte(node),
			keyExpiration: []byte(expires.UTC().Format(time.RFC3339)),
		},
	}
}

// MarkTokenUsed is a copy of the token Secret s marked used at at for key
// (a DER SubjectPublicKeyInfo; only its hash is kept).
func MarkTokenUsed(s *corev1.Secret, at time.Time, key []byte) *corev1.Secret {
	s = s.DeepCopy()
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[keyUsedAt] = []byte(at.UTC().Format(time.RFC3339Nano))
	s.Data[keyUsedByKey] = []byte(keyHash(key))
	return s
}

// ParseTokenSecret is what a TokenSecret (perhaps marked used) says; an
// error names the Secret and what is wrong with it.
func ParseTokenSecret(s *corev1.Secret) (TokenInfo, error) {
	if s.Type != TokenSecretType {
		return TokenInfo{}, fmt.Errorf("secret %s has type %q, not %q", s.Name, s.Type, TokenSecretType)
	}
	info := TokenInfo{ID: string(s.Data[keyID]), Node: string(s.Data[keyNode]), usedByKey: string(s.Data[keyUsedByKey])}
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

// TokenSecretMatches tells whether secret is the secret part of the token
// the Secret s keeps. It compares in constant time, so that response
// timing tells an attacker nothing about how much of a guess was right.
func TokenSecretMatches(s *corev1.Secret, secret string) bool {
	return secretMatches(secret, s.Data[keySecretHash])
}

// hashSecret is the stored form of a token's secret part. A fast unsalted
// hash is enough here, unlike for passwords: the secret is ~82 random bits,
// so there is no dictionary to try and no feasible brute force.
func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func secretMatches(secret string, storedHash []byte) bool {
	return subtle.ConstantTimeCompare([]byte(hashSecret(secret)), storedHash) == 1
}

func keyHash(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:])
}

// Tokens stores bootstrap tokens as Secrets in one namespace: what
// dowsectl makes and lists, and what the controller cleans up.
type Tokens struct {
	secrets SecretClient
	now     func() time.Time
}

// NewTokens stores tokens through secrets (a namespaced Secret client);
// now is the clock expirations are reckoned by (time.Now when nil).
func NewTokens(secrets SecretClient, now func() time.Time) *Tokens {
	if now == nil {
		now = time.Now
	}
	return &Tokens{secrets: secrets, now: now}
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
	// An id collision (one in 36^6 per pair of live tokens) shows as
	// AlreadyExists; drawing again is cheaper than listing first.
	for range 3 {
		tok, err := pki.NewToken()
		if err != nil {
			return pki.Token{}, TokenInfo{}, err
		}
		_, err = t.secrets.Create(ctx, TokenSecret(tok, node, expires), metav1.CreateOptions{})
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
		if info, err := ParseTokenSecret(&list.Items[i]); err == nil {
			out = append(out, info)
		}
	}
	return out, nil
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
		if info, err := ParseTokenSecret(s); err == nil && now.Before(info.Expires) {
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
