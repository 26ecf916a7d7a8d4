// Package dowsectl is the operator's command line: what edge nodes need to
// join the cloud/edge link (bootstrap tokens, the CA pin), and device twins.
package dowsectl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dowse-dev/dowse/controller/linkauth"
	"github.com/dowse-dev/dowse/shared/link/pki"
)

// ErrUsage is wrapped by errors in the command line itself; main exits 2
// on them (the usage has already been printed).
var ErrUsage = errors.New("usage")

const usage = `dowsectl manages Dowse.

  dowsectl token create --node NAME [--ttl 1h] [--output text|json]
      mint a bootstrap token that gives node NAME its link identity once
  dowsectl token list
      list bootstrap tokens (never their secrets)
  dowsectl ca-hash
      print the link CA's pin (sha256:...) for --link-ca-cert-hash, as agents
      that join with their service account token need (no token is made)

Common flags: --kubeconfig PATH, --namespace NS (the controller's, default dowse-system)

` + twinUsage

// Run runs one command; args exclude the program name.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cmd string
	var flagArgs []string
	switch {
	case len(args) >= 1 && args[0] == "twin":
		return runTwin(ctx, args[1:], stdout, stderr)
	case len(args) >= 1 && args[0] == "ca-hash":
		cmd, flagArgs = "ca-hash", args[1:]
	case len(args) >= 2 && args[0] == "token" && (args[1] == "create" || args[1] == "list"):
		cmd, flagArgs = args[1], args[2:]
	default:
		fmt.Fprint(stderr, usage)
		return ErrUsage
	}
	fs := flag.NewFlagSet("dowsectl "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "path to a kubeconfig; default $KUBECONFIG or ~/.kube/config")
	namespace := fs.String("namespace", "dowse-system", "the controller's namespace, where the link CA and the tokens are kept")
	var node, output string
	var ttl time.Duration
	if cmd == "create" {
		fs.StringVar(&node, "node", "", "the node the token is for (its Kubernetes node name)")
		fs.DurationVar(&ttl, "ttl", time.Hour, "how long the token may be used")
		fs.StringVar(&output, "output", "text", "text, or json for scripts")
	}
	if err := fs.Parse(flagArgs); err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	secrets := cs.CoreV1().Secrets(*namespace)
	switch cmd {
	case "list":
		return list(ctx, linkauth.NewTokens(secrets), stdout)
	case "ca-hash":
		ca, err := linkauth.LoadOrCreateCA(ctx, secrets, linkauth.DefaultCAValidity)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, pki.CAPin(ca.Cert))
		return err
	}
	if node == "" {
		return fmt.Errorf("%w: --node is required", ErrUsage)
	}
	if output != "text" && output != "json" {
		return fmt.Errorf("%w: --output must be text or json", ErrUsage)
	}
	res, err := CreateToken(ctx, linkauth.NewTokens(secrets), secrets, node, ttl)
	if err != nil {
		return err
	}
	if output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	_, err = fmt.Fprintf(stdout, `token:        %s
node:         %s
expires:      %s
ca-cert-hash: %s

Give the node's dowse-agent, once, within the token's lifetime:
  --link-bootstrap-token=%s --link-ca-cert-hash=%s
`, res.Token, res.Node, res.Expires.Format(time.RFC3339), res.CACertHash, res.Token, res.CACertHash)
	return err
}

// Result is what token create prints.
type Result struct {
	Token      string    `json:"token"`
	Node       string    `json:"node"`
	Expires    time.Time `json:"expires"`
	CACertHash string    `json:"caCertHash"`
}

// CreateToken mints a token for node and returns it with the link CA's pin.
// It creates the CA when no controller has yet (the same race-safe
// LoadOrCreateCA the controller uses), so tokens can be made before the
// controller first starts.
func CreateToken(ctx context.Context, tokens *linkauth.Tokens, secrets linkauth.SecretClient, node string, ttl time.Duration) (Result, error) {
	ca, err := linkauth.LoadOrCreateCA(ctx, secrets, linkauth.DefaultCAValidity)
	if err != nil {
		return Result{}, err
	}
	tok, info, err := tokens.Create(ctx, node, ttl)
	if err != nil {
		return Result{}, err
	}
	return Result{Token: tok.String(), Node: info.Node, Expires: info.Expires, CACertHash: pki.CAPin(ca.Cert)}, nil
}

func list(ctx context.Context, tokens *linkauth.Tokens, stdout io.Writer) error {
	infos, err := tokens.List(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNODE\tEXPIRES\tUSED")
	for _, t := range infos {
		used := "-"
		if !t.UsedAt.IsZero() {
			used = t.UsedAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.ID, t.Node, t.Expires.Format(time.RFC3339), used)
	}
	return tw.Flush()
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg.UserAgent = "dowsectl"
	return cfg, nil
}
