// Package dowsectl is Dowse's command line, also a kubectl plugin
// (`kubectl dowse`, installed as kubectl-dowse): Configurations, Instances,
// Devices and DeviceModels (get, describe), device twins (twin get, set,
// watch), what edge nodes need to join the cloud/edge link (token, ca-hash),
// and a web console on loopback (console). Its connection flags are
// kubectl's own (k8s.io/cli-runtime), so --kubeconfig, --context, -n, --as
// and the rest mean what they mean there.
package dowsectl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/internal/version"
)

// ErrUsage is wrapped by errors in the command line itself; main exits 2
// on them.
var ErrUsage = errors.New("usage")

func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, args...))
}

// PluginName is the binary's name as a kubectl plugin; kubectl runs it for
// `kubectl dowse`. CompletionPluginName is the name kubectl (1.26 and
// later) runs to complete `kubectl dowse ...`: a link to the same binary.
const (
	PluginName           = "kubectl-dowse"
	CompletionPluginName = "kubectl_complete-dowse"
)

// Run runs one command line; args exclude the program name.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// Every command, completions too, runs on cmd.Context(): ctx, given
	// to ExecuteContext.
	cmd := NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: stdout, ErrOut: stderr}, "dowsectl") //nolint:contextcheck // see above
	cmd.SetArgs(args)
	return cmd.ExecuteContext(ctx)
}

// cli is what every command shares: kubectl's connection flags and the
// streams.
type cli struct {
	flags   *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
	name    string
}

// NewCommand builds the command tree; name is how the user called it
// ("dowsectl", or "kubectl dowse" when run as a plugin), used in help.
func NewCommand(streams genericiooptions.IOStreams, name string) *cobra.Command {
	c := &cli{flags: genericclioptions.NewConfigFlags(true), streams: streams, name: name}
	root := &cobra.Command{
		Use:   "dowsectl",
		Short: "Dowse's command line: discovered devices, their twins, edge nodes' link identity and a web console",
		Long: `dowsectl shows and manages Dowse's objects: Configurations (what to discover),
Instances (what was found), DeviceModels and Devices (twins: desired and
reported values). It also works as a kubectl plugin: kubectl dowse ...`,
		Version:       version.Line("dowsectl"),
		SilenceErrors: true,
		SilenceUsage:  true,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("unknown command %q (see %s --help)", args[0], name)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	if name != "dowsectl" {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: name}
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return fmt.Errorf("%w: %w", ErrUsage, err) })
	c.flags.AddFlags(root.PersistentFlags())
	c.registerFlagCompletions(root)
	root.AddCommand(newGetCommand(c), newDescribeCommand(c), newTwinCommand(c), newTokenCommand(c), newCAHashCommand(c), newEgressConfigCommand(c),
		newConsoleCommand(c), newNodeCommand(), newPortForwardCommand(c), newConvertCommand(c), newVersionCommand())
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print dowsectl's version",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.Line("dowsectl"))
			return err
		},
	}
}

// noArgs and exactArgs are cobra's checks with errors that wrap ErrUsage.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("%s takes no arguments, got %q", cmd.CommandPath(), strings.Join(args, " "))
	}
	return nil
}

func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageErrorf("%s needs %s, got %d argument(s)", cmd.CommandPath(), names, len(args))
		}
		return nil
	}
}

// config is the user's rest.Config, as kubectl would build it from the
// same flags.
func (c *cli) config() (*rest.Config, error) {
	cfg, err := c.flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "dowsectl/" + version.Get()
	// Interactive use: a describe is a handful of requests, the console's
	// watches are long-lived; kubectl's own limits.
	cfg.QPS, cfg.Burst = 50, 300
	return cfg, nil
}

// namespace is -n, else the kubeconfig context's namespace, else default.
func (c *cli) namespace() (string, error) {
	ns, _, err := c.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("loading kubeconfig: %w", err)
	}
	return ns, nil
}

// client is a typed client with Dowse's types.
func (c *cli) client() (client.WithWatch, error) {
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	sch, err := scheme.New()
	if err != nil {
		return nil, err
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: sch})
}

func (c *cli) dynamic() (dynamic.Interface, error) {
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	return dynamic.NewForConfig(cfg)
}

func (c *cli) kube() (kubernetes.Interface, error) {
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
