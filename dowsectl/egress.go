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

func newEgressConfigCommand(c *cli) *cobra.Command {
	var server, out, apiserverDir, name string
	var validity time.Duration
	cmd := &cobra.Command{
		Use:   "egress-config --server HOST:PORT [--dir DIR]",
		Short: "Write the API server's egress configuration and certificate for the controller's egress",
		Long: `Write what the API server needs to send its cluster egress (logs, exec,
port-forward, the pod and service proxy) through the controller's egress, so
that it reaches edge nodes over their links: the link CA's certificate, a
client certificate and key of that CA that may use the egress, and an
EgressSelectorConfiguration naming them. Copy the folder to the control
plane at --apiserver-dir and start kube-apiserver with
--egress-selector-config-file=<apiserver-dir>/egress-selector.yaml.`,
		Example: "  dowsectl egress-config --server dowse-egress.dowse-system.svc:8132 --dir ./dowse-egress",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
	cmd.Flags().StringVar(&out, "dir", "dowse-egress", "folder to write the files to")
	cmd.Flags().StringVar(&apiserverDir, "apiserver-dir", "/etc/kubernetes/dowse-egress", "where the files will be on the control plane (the configuration names them there)")
	cmd.Flags().StringVar(&name, "name", "kube-apiserver", "the client the certificate is for")
	cmd.Flags().DurationVar(&validity, "validity", 365*24*time.Hour, "how long the client certificate is valid")
	return cmd
}
