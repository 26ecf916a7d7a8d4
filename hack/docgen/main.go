// Command docgen writes the reference pages under docs/reference from the
// sources they describe (hack/generate.sh runs it; package refdoc):
//
//	go run ./hack/docgen -out docs/reference
//
// crds.md from the CRDs in deploy/crds, dowsectl.md from dowsectl's
// command tree, chart-values.md from the chart's values.schema.json and
// values.yaml.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/dowse-dev/dowse/dowsectl"
	"github.com/dowse-dev/dowse/hack/docgen/refdoc"
)

type config struct {
	out   string
	crds  string
	chart string
}

func main() {
	var cfg config
	flag.StringVar(&cfg.out, "out", "docs/reference", "folder the pages are written to")
	flag.StringVar(&cfg.crds, "crds", "deploy/crds", "folder of the CRD manifests")
	flag.StringVar(&cfg.chart, "chart", "deploy/helm/dowse", "the Helm chart")
	flag.Parse()
	if err := run(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "docgen: %v\n", err)
		os.Exit(1)
	}
}

func run(cfg config) error {
	pages := map[string]func(config) ([]byte, error){
		"crds.md":         crdPage,
		"dowsectl.md":     cliPage,
		"chart-values.md": valuesPage,
	}
	names := make([]string, 0, len(pages))
	for n := range pages {
		names = append(names, n)
	}
	sort.Strings(names)
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	for _, n := range names {
		b, err := pages[n](cfg)
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		if err := os.WriteFile(filepath.Join(cfg.out, n), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func crdPage(cfg config) ([]byte, error) {
	files, err := filepath.Glob(filepath.Join(cfg.crds, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var crds []*refdoc.CRD
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		c, err := refdoc.ParseCRD(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		crds = append(crds, c)
	}
	refdoc.SortKinds(crds, "Configuration", "Instance", "DeviceModel", "Device")
	return refdoc.CRDPage(crds, "Every field of Dowse's custom resources, generated from the CRDs in "+
		"`deploy/crds` (which controller-gen makes from the Go types in `shared/api/v1alpha1`) by "+
		"`make generate`. Change the types' doc comments and markers, not this page.")
}

func cliPage(_ config) ([]byte, error) {
	root := dowsectl.NewCommand(genericiooptions.NewTestIOStreamsDiscard(), "dowsectl")
	common := pflag.NewFlagSet("kubectl", pflag.ContinueOnError)
	genericclioptions.NewConfigFlags(true).AddFlags(common)
	// --cache-dir defaults to a folder in the home directory of whoever
	// generates the page: written as $HOME, the page is the same anywhere.
	if home, err := os.UserHomeDir(); err == nil && home != "" {
		common.VisitAll(func(f *pflag.Flag) { f.DefValue = strings.ReplaceAll(f.DefValue, home, "$HOME") })
	}
	return refdoc.CLIPage(root, "Every command of `dowsectl`, generated from its command tree by "+
		"`make generate`. Installed as `kubectl-dowse`, the same binary is the kubectl plugin: "+
		"`kubectl dowse get devices` is `dowsectl get devices`. Every command takes `-h, --help`.",
		common, "Connection flags",
		"Every command takes kubectl's own connection flags (k8s.io/cli-runtime's), which mean "+
			"what they mean for kubectl: `--kubeconfig`, `--context`, `-n, --namespace` and the rest "+
			"below. They are left out of each command's flags.")
}

func valuesPage(cfg config) ([]byte, error) {
	schema, err := os.ReadFile(filepath.Join(cfg.chart, "values.schema.json"))
	if err != nil {
		return nil, err
	}
	values, err := os.ReadFile(filepath.Join(cfg.chart, "values.yaml"))
	if err != nil {
		return nil, err
	}
	return refdoc.ValuesPage(schema, values, "Every value of the Helm chart `deploy/helm/dowse`, "+
		"generated from its `values.schema.json` and `values.yaml` by `make generate`: paths as "+
		"`helm install --set` takes them, defaults as `values.yaml` sets them, descriptions from "+
		"the schema or else from `values.yaml`'s comments. Change those files, not this page.")
}
