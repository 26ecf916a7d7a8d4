package dowsectl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/bootstrap"
	"github.com/dowse-dev/dowse/internal/link/pki"
)

// DefaultControllerNamespace is where the link CA and the bootstrap tokens
// are kept unless -n says otherwise.
const DefaultControllerNamespace = "dowse-system"

// controllerNamespace is -n when given, else DefaultControllerNamespace:
// the kubeconfig's namespace is where the user's devices are, not the
// controller.
func (c *cli) controllerNamespace() string {
	if c.flags.Namespace != nil && *c.flags.Namespace != "" {
		return *c.flags.Namespace
	}
	return DefaultControllerNamespace
}

func (c *cli) secrets() (bootstrap.SecretClient, error) {
	cs, err := c.kube()
	if err != nil {
		return nil, err
	}
	return cs.CoreV1().Secrets(c.controllerNamespace()), nil
}

func newTokenCommand(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Bootstrap tokens that give an edge node its link identity once",
		Long: `Bootstrap tokens give an edge node its link identity (a client certificate
naming node:<name>) once. They are kept in the controller's namespace
(-n, default ` + DefaultControllerNamespace + `).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var node, output string
	var ttl time.Duration
	create := &cobra.Command{
		Use:     "create --node NAME [--ttl 1h]",
		Short:   "Mint a bootstrap token for one node",
		Example: "  dowsectl token create --node edge-1 --ttl 1h\n  dowsectl token create --node edge-1 -o json",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" {
				return usageErrorf("--node is required: the node the token is for (its Kubernetes node name)")
			}
			if output != "" && output != "text" && output != "json" && output != "yaml" {
				return usageErrorf("-o must be json or yaml (default: text), not %q", output)
			}
			secrets, err := c.secrets()
			if err != nil {
				return err
			}
			res, err := CreateToken(cmd.Context(), bootstrap.NewTokens(secrets, nil), secrets, node, ttl)
			if err != nil {
				return err
			}
			return printResult(c.streams.Out, output, res)
		},
	}
	create.Flags().StringVar(&node, "node", "", "the node the token is for (its Kubernetes node name)")
	create.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token may be used")
	create.Flags().StringVarP(&output, "output", "o", "", "json or yaml for scripts (default: text)")
	var listOutput string
	list := &cobra.Command{
		Use:   "list",
		Short: "List bootstrap tokens (never their secrets)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			secrets, err := c.secrets()
			if err != nil {
				return err
			}
			return listTokens(cmd.Context(), bootstrap.NewTokens(secrets, nil), c.streams.Out, listOutput)
		},
	}
	list.Flags().StringVarP(&listOutput, "output", "o", "", "wide, json, yaml or name (default: a table)")
	cmd.AddCommand(create, list)
	return cmd
}

func newCAHashCommand(c *cli) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "ca-hash",
		Short: "Print the link CA's pin (sha256:...) for agents' --link-ca-cert-hash",
		Long: `Print the link CA's pin (sha256:...), which agents that join with their
service account token need for --link-ca-cert-hash. No token is made. The CA
is created when no controller has made it yet.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			secrets, err := c.secrets()
			if err != nil {
				return err
			}
			ca, err := bootstrap.LoadOrCreateCA(cmd.Context(), secrets, bootstrap.DefaultCAValidity)
			if err != nil {
				return err
			}
			pin := pki.CAPin(ca.Cert)
			switch output {
			case "":
				_, err = fmt.Fprintln(c.streams.Out, pin)
				return err
			case "json", "yaml":
				return printResult(c.streams.Out, output, map[string]string{"caCertHash": pin})
			}
			return usageErrorf("-o must be json or yaml (default: the pin alone), not %q", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or yaml (default: the pin alone)")
	return cmd
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
func CreateToken(ctx context.Context, tokens *bootstrap.Tokens, secrets bootstrap.SecretClient, node string, ttl time.Duration) (Result, error) {
	ca, err := bootstrap.LoadOrCreateCA(ctx, secrets, bootstrap.DefaultCAValidity)
	if err != nil {
		return Result{}, err
	}
	tok, info, err := tokens.Create(ctx, node, ttl)
	if err != nil {
		return Result{}, err
	}
	return Result{Token: tok.String(), Node: info.Node, Expires: info.Expires, CACertHash: pki.CAPin(ca.Cert)}, nil
}

func printResult(w io.Writer, output string, v any) error {
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	res, ok := v.(Result)
	if !ok {
		return fmt.Errorf("%w: -o %q: use -o json or -o yaml", ErrUsage, output)
	}
	_, err := fmt.Fprintf(w, `token:        %s
node:         %s
expires:      %s
ca-cert-hash: %s

Give the node's dowse-agent, once, within the token's lifetime:
  --link-bootstrap-token=%s --link-ca-cert-hash=%s
`, res.Token, res.Node, res.Expires.Format(time.RFC3339), res.CACertHash, res.Token, res.CACertHash)
	return err
}

// tokenRow is a token as token list prints it.
type tokenRow struct {
	ID      string     `json:"id"`
	Node    string     `json:"node"`
	Expires time.Time  `json:"expires"`
	Used    *time.Time `json:"used,omitempty"`
}

func listTokens(ctx context.Context, tokens *bootstrap.Tokens, w io.Writer, output string) error {
	infos, err := tokens.List(ctx)
	if err != nil {
		return err
	}
	rows := []tokenRow{}
	for _, t := range infos {
		r := tokenRow{ID: t.ID, Node: t.Node, Expires: t.Expires}
		if !t.UsedAt.IsZero() {
			r.Used = &t.UsedAt
		}
		rows = append(rows, r)
	}
	switch output {
	case "json", "yaml":
		return printResult(w, output, map[string]any{"tokens": rows})
	case "name":
		for _, r := range rows {
			fmt.Fprintln(w, "token/"+r.ID)
		}
		return nil
	case "", "wide":
	default:
		return usageErrorf("-o must be wide, json, yaml or name, not %q", output)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNODE\tEXPIRES\tUSED")
	for _, r := range rows {
		used := "-"
		if r.Used != nil {
			used = r.Used.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.ID, r.Node, r.Expires.Format(time.RFC3339), used)
	}
	return tw.Flush()
}
