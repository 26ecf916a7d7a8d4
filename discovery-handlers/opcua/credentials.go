package opcua

import (
	"crypto/rsa"
	"crypto/tls"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// credentials is the client certificate a Configuration gave, if any.
type credentials struct {
	certDER []byte
	key     *rsa.PrivateKey
}

// parseCredentials reads the client certificate and key from the discovery
// properties. Both or neither must be set; a half-configured or unreadable
// pair is an InvalidArgument error rather than a silent fall back to
// SecurityMode None, so that the person who set up the Secret finds out.
func parseCredentials(props map[string]*discoveryv1.ByteData) (*credentials, error) {
	cert, key := props[ClientCertificateProperty].GetVec(), props[ClientKeyProperty].GetVec()
	switch {
	case cert == nil && key == nil:
		return nil, nil
	case cert == nil:
		return nil, status.Errorf(codes.InvalidArgument, "discovery_properties: %s is set but %s is not", ClientKeyProperty, ClientCertificateProperty)
	case key == nil:
		return nil, status.Errorf(codes.InvalidArgument, "discovery_properties: %s is set but %s is not", ClientCertificateProperty, ClientKeyProperty)
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "discovery_properties: %s/%s: %v", ClientCertificateProperty, ClientKeyProperty, err)
	}
	rsaKey, ok := pair.PrivateKey.(*rsa.PrivateKey)
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "discovery_properties: %s: OPC UA needs an RSA key", ClientKeyProperty)
	}
	return &credentials{certDER: pair.Certificate[0], key: rsaKey}, nil
}
