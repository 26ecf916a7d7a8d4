package lifecycle

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/scheme"
)

// Commands are the dowse-controller subcommands of this package, which the
// chart's hooks run.
var Commands = map[string]string{
	"apply-crds":      "apply the CRDs this binary was built with (server-side) and wait until they are served",
	"uninstall":       "delete every Configuration, Device and DeviceModel and wait until nothing Dowse made is left",
	"after-uninstall": "once the release's controller and agents are gone, delete the link's Leases",
}

// Command runs subcommand name with args (the flags after it).
func Command(ctx context.Context, name string, args []string, log logr.Logger) error {
	fs := flag.NewFlagSet("dowse-controller "+name, flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "path to a kubeconfig; empty means in-cluster")
	var o UninstallOptions
	ns := fs.String("namespace", envOr("POD_NAMESPACE", "dowse-system"), "namespace of the agent Pods (env POD_NAMESPACE)")
	sel := fs.String("agent-pod-selector", "app.kubernetes.io/name=dowse-agent", "label selector of the agent DaemonSet's Pods")
	rel := fs.String("release-pod-selector", "app.kubernetes.io/part-of=dowse", "after-uninstall: label selector of the release's Pods, waited out")
	fs.DurationVar(&o.Timeout, "timeout", 2*time.Minute, "how long to wait until nothing is left")
	fs.BoolVar(&o.KeepModels, "keep-models", false, "leave DeviceModels and hand-written Devices in place")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	switch name {
	case "apply-crds":
		return ApplyCRDs(ctx, cfg, log)
	case "after-uninstall":
		s, err := labels.Parse(*rel)
		if err != nil {
			return fmt.Errorf("--release-pod-selector %q: %w", *rel, err)
		}
		c, err := newClient(cfg)
		if err != nil {
			return err
		}
		return AfterUninstall(ctx, c, *ns, s, o.Timeout, log)
	case "uninstall":
		s, err := labels.Parse(*sel)
		if err != nil {
			return fmt.Errorf("--agent-pod-selector %q: %w", *sel, err)
		}
		c, err := newClient(cfg)
		if err != nil {
			return err
		}
		o.Agents = Agents{Reader: c, Namespace: *ns, Selector: s}
		return Uninstall(ctx, c, o, log)
	}
	return fmt.Errorf("unknown command %q", name)
}

func newClient(cfg *rest.Config) (client.Client, error) {
	sch, err := scheme.New()
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: sch})
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
