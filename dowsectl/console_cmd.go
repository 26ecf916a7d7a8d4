package dowsectl

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/dowsectl/console"
	"github.com/dowse-dev/dowse/internal/dowsectl/live"
)

func newConsoleCommand(c *cli) *cobra.Command {
	listen := console.DefaultListen
	var all, allowRemote bool
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve a web page on loopback that shows devices and twins live",
		Long: `Serve a web page (on ` + console.DefaultListen + ` unless --listen says otherwise) that shows the
namespace's Configurations with each node's state and their Instances as they
come and go, Devices with their twins (desired, reported, state, last report,
a small plot of numeric values), a form to set desired values (checked against
the model as twin set checks them) and the Events of the object in view.
Reported values come live from the controller's readings API
(readings.dowse.dev, kubectl get devicereadings) when the API server serves
it, ahead of Device.status, which is written under a budget; otherwise from
Device.status. Each value shows its source (live or status) and age.

It talks to the API server with your kubeconfig and rights, as kubectl proxy
does: nothing is installed in the cluster, and the page can do what you may
do. Open the printed address in a browser: it holds a one-time login that the
page trades for a cookie, so other users and processes of this machine cannot
use the page; restart the command for a new one. Ctrl-C stops it.`,
		Example: "  dowsectl console\n  dowsectl console -n plant-3 --listen 127.0.0.1:9000\n  kubectl dowse console -A",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ns, err := c.namespace()
			if err != nil {
				return err
			}
			if all {
				ns = ""
			}
			dyn, err := c.dynamic()
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			cfg, err := c.config()
			if err != nil {
				return err
			}
			raw, _ := c.flags.ToRawKubeConfigLoader().RawConfig()
			ctxName := raw.CurrentContext
			if c.flags.Context != nil && *c.flags.Context != "" {
				ctxName = *c.flags.Context
			}
			dc, err := discovery.NewDiscoveryClientForConfig(cfg)
			if err != nil {
				return err
			}
			srv, err := console.New(console.Config{
				Listen: listen, AllowRemote: allowRemote, Namespace: ns, Dynamic: dyn, Context: ctxName, Server: cfg.Host,
				Readings: func(context.Context) bool { return live.ReadingsServed(dc) },
				SetDesired: func(ctx context.Context, key client.ObjectKey, property, value string) error {
					return SetDesired(ctx, cl, key, property, value)
				},
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(c.streams.Out, "Dowse console on %s (API server %s, as your kubeconfig's user); Ctrl-C stops it\n", srv.URL(), cfg.Host)
			return srv.Start(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&listen, "listen", listen, "address to serve the page on (keep it on loopback: the page acts with your credentials)")
	cmd.Flags().BoolVar(&allowRemote, "allow-remote", false, "serve on an address other than loopback (whoever reaches it and obtains the printed address acts with your credentials)")
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "show every namespace")
	return cmd
}
