package nodeapi

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/dowse-dev/dowse/internal/link/pki"
)

// Files in Config.Dir besides the store.
const (
	servingCAFile   = "serving-ca.crt"
	servingCertFile = "serving.crt"
	servingKeyFile  = "serving.key"
)

// servingValidity is long: the kubelet's kubeconfig names the CA, and a
// node may stay offline for long.
const servingValidity = 10 * 365 * 24 * time.Hour

// ensureServing returns the proxy's serving certificate, made with its own
// CA on first use (loopback names only).
func ensureServing(dir string) (tls.Certificate, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, err
	}
	certPath, keyPath := filepath.Join(dir, servingCertFile), filepath.Join(dir, servingKeyFile)
	if cert, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		return cert, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return tls.Certificate{}, fmt.Errorf("node API serving certificate: %w", err)
	}
	ca, err := pki.NewCA("dowse-node-api", servingValidity)
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := ca.IssueServer([]string{"127.0.0.1", "localhost", "::1"}, servingValidity)
	if err != nil {
		return tls.Certificate{}, err
	}
	certPEM, keyPEM, err := pki.PairPEM(cert)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return tls.Certificate{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, servingCAFile), ca.CertPEM, 0o644); err != nil {
		return tls.Certificate{}, err
	}
	if err := os.WriteFile(certPath, certPEM, 0o644); err != nil {
		return tls.Certificate{}, err
	}
	return cert, nil
}

func upstreamClientCert(c *rest.Config) (*x509.Certificate, error) {
	certPEM := c.CertData
	if len(certPEM) == 0 && c.CertFile != "" {
		var err error
		if certPEM, err = os.ReadFile(c.CertFile); err != nil {
			return nil, fmt.Errorf("node API: the node's certificate: %w", err)
		}
	}
	for len(certPEM) > 0 {
		var b *pem.Block
		b, certPEM = pem.Decode(certPEM)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			return x509.ParseCertificate(b.Bytes)
		}
	}
	return nil, errors.New("node API: the upstream kubeconfig names no client certificate (the kubelet's own is needed)")
}

// KubeletKubeconfig is the kubeconfig that points a kubelet at the proxy
// listening on listen: the proxy's CA from dir, and the client certificate
// the kubelet already uses (from upstream, the kubelet's own kubeconfig).
// It makes the serving certificate if there is none yet, so that it can be
// written before the proxy first runs.
func KubeletKubeconfig(upstream *clientcmdapi.Config, listen, dir string) (*clientcmdapi.Config, error) {
	if _, err := ensureServing(dir); err != nil {
		return nil, err
	}
	ctx := upstream.Contexts[upstream.CurrentContext]
	if ctx == nil {
		return nil, fmt.Errorf("the kubelet's kubeconfig has no context %q", upstream.CurrentContext)
	}
	user := upstream.AuthInfos[ctx.AuthInfo]
	if user == nil || (len(user.ClientCertificateData) == 0 && user.ClientCertificate == "") {
		return nil, errors.New("the kubelet's kubeconfig names no client certificate")
	}
	if _, _, err := net.SplitHostPort(listen); err != nil {
		return nil, fmt.Errorf("listen address %q: %w", listen, err)
	}
	out := clientcmdapi.NewConfig()
	out.Clusters["dowse-node-api"] = &clientcmdapi.Cluster{
		Server:               "https://" + listen,
		CertificateAuthority: filepath.Join(dir, servingCAFile),
	}
	out.AuthInfos["node"] = user.DeepCopy()
	out.Contexts["node"] = &clientcmdapi.Context{Cluster: "dowse-node-api", AuthInfo: "node"}
	out.CurrentContext = "node"
	return out, nil
}

// WriteKubeletKubeconfig writes KubeletKubeconfig to path (0600).
func WriteKubeletKubeconfig(upstreamPath, listen, dir, path string) error {
	up, err := clientcmd.LoadFromFile(upstreamPath)
	if err != nil {
		return err
	}
	cfg, err := KubeletKubeconfig(up, listen, dir)
	if err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}
