package pki

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"strings"
)

// PinPrefix starts every CA pin: the hash function's name, as kubeadm's
// --discovery-token-ca-cert-hash spells it, so that another hash can be
// added later without ambiguity.
const PinPrefix = "sha256:"

// CAPin is the pin an edge is given at bootstrap to trust the cloud's CA:
// "sha256:" and the hex SHA-256 of the CA certificate's SubjectPublicKeyInfo.
// It pins the key rather than the whole certificate (as kubeadm does), so
// that re-issuing the CA certificate with the same key keeps old pins valid.
func CAPin(ca *x509.Certificate) string {
	sum := sha256.Sum256(ca.RawSubjectPublicKeyInfo)
	return PinPrefix + hex.EncodeToString(sum[:])
}

// ParsePin checks a pin's form and returns it in canonical form (lower case).
func ParsePin(pin string) (string, error) {
	h, ok := strings.CutPrefix(strings.ToLower(strings.TrimSpace(pin)), PinPrefix)
	if !ok {
		return "", fmt.Errorf("CA pin %q does not start with %q", pin, PinPrefix)
	}
	if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("CA pin %q: want %s and 64 hex digits", pin, PinPrefix)
	}
	return PinPrefix + h, nil
}

// MatchesPin reports whether ca's key is the one pin names. pin must be in
// canonical form (ParsePin).
func MatchesPin(ca *x509.Certificate, pin string) bool {
	return subtle.ConstantTimeCompare([]byte(CAPin(ca)), []byte(pin)) == 1
}
