package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/internal/link/pki"
)

const (
	// CASecretName is the Secret (in the controller's namespace) that holds
	// the link CA's certificate and key, as a kubernetes.io/tls Secret.
	CASecretName = "dowse-link-ca"
	// DefaultCAValidity is the CA's lifetime when it is created. Rotating
	// the CA means re-bootstrapping every edge, so it is long.
	DefaultCAValidity = 10 * 365 * 24 * time.Hour
	caCommonName      = "dowse-link-ca"
)

// CASecret is the Secret that keeps ca: CASecretName, of type
// kubernetes.io/tls. ParseCASecret reads it back.
func CASecret(ca *pki.CA) (*corev1.Secret, error) {
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:   CASecretName,
			Labels: map[string]string{"app.kubernetes.io/part-of": "dowse"},
		},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: keyPEM},
	}, nil
}

// ParseCASecret is the CA a CASecret keeps; an error names the Secret.
func ParseCASecret(s *corev1.Secret) (*pki.CA, error) {
	ca, err := pki.LoadCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	return ca, nil
}

// LoadOrCreateCA returns the link CA kept in the CASecretName Secret,
// creating it when it does not exist. Several callers (two controller
// replicas, dowsectl) may race: each generates a CA, only one Create
// succeeds, and the losers read the winner's Secret, so all agree on one CA.
// A Secret that exists but does not hold a usable CA is an error, never
// overwritten: replacing a CA would lock out every edge.
func LoadOrCreateCA(ctx context.Context, secrets SecretClient, validity time.Duration) (*pki.CA, error) {
	log := logr.FromContextOrDiscard(ctx)
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	// Two rounds suffice: a Create that lost the race is followed by a Get
	// that sees the winner. A third round means the Secret was deleted in
	// between, which is worth an error rather than a loop.
	for range 2 {
		s, err := secrets.Get(ctx, CASecretName, metav1.GetOptions{})
		if err == nil {
			return ParseCASecret(s)
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading link CA secret %s: %w", CASecretName, err)
		}
		ca, err := pki.NewCA(caCommonName, validity)
		if err != nil {
			return nil, fmt.Errorf("creating link CA: %w", err)
		}
		s, err = CASecret(ca)
		if err != nil {
			return nil, err
		}
		_, err = secrets.Create(ctx, s, metav1.CreateOptions{})
		switch {
		case err == nil:
			log.Info("created link CA", "secret", CASecretName, "pin", pki.CAPin(ca.Cert), "notAfter", ca.Cert.NotAfter)
			return ca, nil
		case apierrors.IsAlreadyExists(err):
			continue // another replica won: use its CA
		default:
			return nil, fmt.Errorf("storing link CA secret %s: %w", CASecretName, err)
		}
	}
	return nil, errors.New("link CA secret was created and deleted while reading it; try again")
}
