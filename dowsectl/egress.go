package dowsectl

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/dowse-dev/dowse/internal/bootstrap"
	"github.com/dowse-dev/dowse/internal/link/pki"
)

// EgressSelector is the API server's EgressSelectorConfiguration sending
// its cluster egress to the controller's --egress-address at server, with
// the files under dir as the API server will read them.
func EgressSelector(server, dir string) string {
	return `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      tcp:
        url: https://` + server + `
        tlsConfig:
          caBundle: ` + filepath.Join(dir, "ca.crt") + `
          clientCert: ` + filepath.Join(dir, "client.crt") + `
          clientKey: ` + filepath.Join(dir, "client.key") + "\n"
}

// The proxy protocols of an EgressSelectorConfiguration the controller's
// egress serves (its --egress-protocol).
const (
	ProtocolHTTPConnect = "HTTPConnect"
	ProtocolGRPC        = "GRPC"
)

// EgressSelectorUDS is the API server's EgressSelectorConfiguration
// sending its cluster egress to the controller's --egress-uds at uds, in
// protocol (HTTPConnect or GRPC; the controller's --egress-protocol must
// be the same). The socket's permissions are the API server's identity:
// no certificate is named.
func EgressSelectorUDS(protocol, uds string) (string, error) {
	switch protocol {
	case ProtocolHTTPConnect, ProtocolGRPC:
	default:
		return "", fmt.Errorf("proxy protocol %q: want %s or %s", protocol, ProtocolHTTPConnect, ProtocolGRPC)
	}
	if !filepath.IsAbs(uds) {
		return "", fmt.Errorf("the egress socket %q must be an absolute path", uds)
	}
	return `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: ` + protocol + `
    transport:
      uds:
        udsName: ` + uds + "\n", nil
}

// errGRPCOverTCP says why GRPC with --server is refused.
var errGRPCOverTCP = usageErrorf("kube-apiserver speaks the GRPC egress only over a Unix socket: give --uds (the controller's --egress-uds on the control plane's host, with --egress-protocol GRPC), or use --protocol %s for --server (TCP with mutual TLS)", ProtocolHTTPConnect)

func newEgressConfigCommand(c *cli) *cobra.Command {
	var server, uds, protocol, out, apiserverDir, name string
	var validity time.Duration
	cmd := &cobra.Command{
		Use:   "egress-config (--server HOST:PORT [--dir DIR] | --uds PATH [--protocol GRPC])",
		Short: "Write the API server's egress configuration and certificate for the controller's egress",
		Long: `Write what the API server needs to send its cluster egress (logs, exec,
port-forward, the pod and service proxy) through the controller's egress, so
that it reaches edge nodes over their links: the link CA's certificate, a
client certificate and key of that CA that may use the egress, and an
EgressSelectorConfiguration naming them. Copy the folder to the control
plane at --apiserver-dir and start kube-apiserver with
--egress-selector-config-file=<apiserver-dir>/egress-selector.yaml.

With --uds instead (a control plane that shares its host with a controller
replica started with --egress-uds), the socket's permissions are the API
server's identity: only the EgressSelectorConfiguration is printed, in
--protocol HTTPConnect or GRPC (the controller's --egress-protocol).
kube-apiserver speaks the GRPC egress only over a Unix socket (its
validation refuses GRPC over TCP), so --protocol GRPC needs --uds.`,
		Example: `  dowsectl egress-config --server dowse-egress.dowse-system.svc:8132 --dir ./dowse-egress
  dowsectl egress-config --uds /run/dowse/egress.sock --protocol GRPC > /etc/kubernetes/egress-selector.yaml`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if uds != "" {
				if server != "" {
					return usageErrorf("give --server or --uds, not both")
				}
				conf, err := EgressSelectorUDS(protocol, uds)
				if err != nil {
					return usageErrorf("%v", err)
				}
				_, err = fmt.Fprint(c.streams.Out, conf)
				return err
			}
			switch protocol {
			case ProtocolHTTPConnect:
			case ProtocolGRPC:
				return errGRPCOverTCP
			default:
				return usageErrorf("--protocol %q: want %s or %s", protocol, ProtocolHTTPConnect, ProtocolGRPC)
			}
			if _, _, err := net.SplitHostPort(server); err != nil {
				return usageErrorf("--server must be the egress's host:port (its Service), not %q", server)
			}
			if apiserverDir == "" {
				return usageErrorf("--apiserver-dir must name where the files will be on the control plane")
			}
			secrets, err := c.secrets()
			if err != nil {
				return err
			}
			ca, err := bootstrap.LoadOrCreateCA(cmd.Context(), secrets, bootstrap.DefaultCAValidity)
			if err != nil {
				return err
			}
			cert, err := ca.IssueEgressClient(name, validity)
			if err != nil {
				return err
			}
			certPEM, keyPEM, err := pki.PairPEM(cert)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o700); err != nil {
				return err
			}
			files := []struct {
				name string
				data []byte
				mode os.FileMode
			}{
				{"ca.crt", ca.CertPEM, 0o644},
				{"client.crt", certPEM, 0o644},
				{"client.key", keyPEM, 0o600},
				{"egress-selector.yaml", []byte(EgressSelector(server, apiserverDir)), 0o644},
			}
			var errs []error
			for _, f := range files {
				errs = append(errs, os.WriteFile(filepath.Join(out, f.name), f.data, f.mode))
			}
			if err := errors.Join(errs...); err != nil {
				return err
			}
			_, err = fmt.Fprintf(c.streams.Out, "wrote %s: copy it to %s on the control plane and start kube-apiserver with\n  --egress-selector-config-file=%s\nThe client certificate is valid until %s.\n",
				out, apiserverDir, filepath.Join(apiserverDir, "egress-selector.yaml"), time.Now().Add(validity).UTC().Format(time.DateOnly))
			return err
		},
	}
	cmd.Flags().StringVar(&server, "server", "", "the controller's egress as the API server reaches it (host:port of the dowse-egress Service)")
	cmd.Flags().StringVar(&uds, "uds", "", "the controller's --egress-uds as the API server reaches it (an absolute path on the control plane's host): print the configuration for it, no certificate")
	cmd.Flags().StringVar(&protocol, "protocol", ProtocolHTTPConnect, "the proxy protocol, as the controller's --egress-protocol: HTTPConnect, or GRPC (with --uds only)")
	cmd.Flags().StringVar(&out, "dir", "dowse-egress", "folder to write the files to")
	cmd.Flags().StringVar(&apiserverDir, "apiserver-dir", "/etc/kubernetes/dowse-egress", "where the files will be on the control plane (the configuration names them there)")
	cmd.Flags().StringVar(&name, "name", "kube-apiserver", "the client the certificate is for")
	cmd.Flags().DurationVar(&validity, "validity", 365*24*time.Hour, "how long the client certificate is valid")
	return cmd
}
