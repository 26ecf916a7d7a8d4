package dowsectl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/client-go/dynamic"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// readFlags are the flags of every read: kubectl's -o and selection flags.
type readFlags struct {
	print         *genericclioptions.PrintFlags
	allNamespaces bool
	selector      string
	fieldSelector string
	noHeaders     bool
	showLabels    bool
	labelColumns  []string
}

func (f *readFlags) add(cmd *cobra.Command, selection bool) {
	f.print = genericclioptions.NewPrintFlags("")
	f.print.AddFlags(cmd)
	cmd.Flags().Lookup("output").Usage = "Output format: wide, json, yaml, name, jsonpath=..., go-template=... (default: a table)"
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return append([]string{"wide"}, f.print.AllowedFormats()...), cobra.ShellCompDirectiveNoFileComp
	})
	if !selection {
		return
	}
	cmd.Flags().BoolVarP(&f.allNamespaces, "all-namespaces", "A", false, "list across all namespaces")
	cmd.Flags().StringVarP(&f.selector, "selector", "l", "", "label selector, e.g. -l dowse.dev/configuration=plc")
	cmd.Flags().StringVar(&f.fieldSelector, "field-selector", "", "field selector, e.g. --field-selector metadata.name=plc-1a2b")
	cmd.Flags().BoolVar(&f.noHeaders, "no-headers", false, "print tables without their header")
	cmd.Flags().BoolVar(&f.showLabels, "show-labels", false, "add the labels as the last column")
	cmd.Flags().StringSliceVarP(&f.labelColumns, "label-columns", "L", nil, "labels to show as columns")
}

// format is "" or "wide" for tables, else a cli-runtime printer's format.
func (f *readFlags) format() string { return *f.print.OutputFormat }

func (f *readFlags) table() bool { return f.format() == "" || f.format() == "wide" }

// printer is the cli-runtime printer of a non-table format.
func (f *readFlags) printer() (printers.ResourcePrinter, error) {
	p, err := f.print.ToPrinter()
	if err != nil {
		return nil, fmt.Errorf("%w: %w (or wide)", ErrUsage, err)
	}
	return p, nil
}

func newGetCommand(c *cli) *cobra.Command {
	var f readFlags
	cmd := &cobra.Command{
		Use:   "get TYPE [NAME...] | TYPE/NAME...",
		Short: "List Configurations, Instances, DeviceModels or Devices (dowse: all of them)",
		Long: `List Dowse's objects with the columns their CRDs define (-o wide adds the
wide ones), or print them as JSON, YAML or names.

TYPE is configurations (dcfg), instances (dins), devicemodels (dmodel),
devices (ddev), a comma-separated list of them, or dowse for all four.`,
		Example: `  dowsectl get configurations
  dowsectl get instances -o wide
  dowsectl get devices boiler-1 -o yaml
  dowsectl get dowse -A`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.completeTypeThenNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			targets, err := parseTargets(args)
			if err != nil {
				return err
			}
			return c.get(cmd.Context(), &f, targets)
		},
	}
	f.add(cmd, true)
	return cmd
}

// restClient talks to dowse.dev/v1alpha1 directly, for Table requests.
func (c *cli) restClient() (rest.Interface, error) {
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	cfg.GroupVersion = &v1alpha1.GroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	return rest.RESTClientFor(cfg)
}

// tableAccept asks the API server for the CRD's printer columns, as
// kubectl get does.
const tableAccept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"

func (c *cli) get(ctx context.Context, f *readFlags, targets []target) error {
	ns, err := c.namespace()
	if err != nil {
		return err
	}
	if f.allNamespaces {
		ns = ""
	}
	opts := metav1.ListOptions{LabelSelector: f.selector, FieldSelector: f.fieldSelector}
	var errs []error
	out := c.streams.Out
	if f.table() {
		rc, err := c.restClient()
		if err != nil {
			return err
		}
		printed := 0
		for _, t := range targets {
			tbl, err := fetchTable(ctx, rc, t, ns, opts)
			errs = append(errs, err)
			if tbl == nil || len(tbl.Rows) == 0 {
				continue
			}
			if printed > 0 {
				fmt.Fprintln(out)
			}
			printed++
			p := printers.NewTablePrinter(printers.PrintOptions{
				Wide: f.format() == "wide", NoHeaders: f.noHeaders, WithNamespace: f.allNamespaces,
				WithKind: len(targets) > 1, Kind: t.res.GroupKind(), ShowLabels: f.showLabels, ColumnLabels: f.labelColumns,
			})
			if err := p.PrintObj(tbl, out); err != nil {
				return err
			}
		}
		if printed == 0 && errors.Join(errs...) == nil {
			noneFound(c.streams.ErrOut, ns)
		}
		return errors.Join(errs...)
	}
	p, err := f.printer()
	if err != nil {
		return err
	}
	dyn, err := c.dynamic()
	if err != nil {
		return err
	}
	var items []unstructured.Unstructured
	for _, t := range targets {
		objs, err := fetchObjects(ctx, dyn, t, ns, opts)
		errs = append(errs, err)
		items = append(items, objs...)
	}
	// One object asked for by name prints as itself, as with kubectl;
	// anything else as a List.
	if len(targets) == 1 && len(targets[0].names) == 1 && len(items) == 1 {
		return errors.Join(append(errs, p.PrintObj(&items[0], out))...)
	}
	if len(items) == 0 && f.format() == "name" {
		noneFound(c.streams.ErrOut, ns)
		return errors.Join(errs...)
	}
	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "List", "metadata": map[string]any{"resourceVersion": ""}}, Items: items}
	if items == nil {
		list.Items = []unstructured.Unstructured{}
	}
	return errors.Join(append(errs, p.PrintObj(list, out))...)
}

func noneFound(w io.Writer, ns string) {
	if ns == "" {
		fmt.Fprintln(w, "No resources found")
		return
	}
	fmt.Fprintf(w, "No resources found in %s namespace.\n", ns)
}

// fetchTable gets t's objects (its names, or a list) as the API server's
// Table, with each row's object metadata decoded for the namespace and
// label columns. A name is listed with a field selector: a missing object
// is then an empty table (and a NotFound in the usual words), while a
// resource the API server does not serve stays its own error.
func fetchTable(ctx context.Context, rc rest.Interface, t target, ns string, opts metav1.ListOptions) (*metav1.Table, error) {
	list := func(fieldSelector string) (*metav1.Table, error) {
		req := rc.Get().Resource(t.res.Plural).SetHeader("Accept", tableAccept)
		if ns != "" {
			req = req.Namespace(ns)
		}
		if opts.LabelSelector != "" {
			req = req.Param("labelSelector", opts.LabelSelector)
		}
		if fieldSelector != "" {
			req = req.Param("fieldSelector", fieldSelector)
		}
		raw, err := req.Do(ctx).Raw()
		if err != nil {
			return nil, err
		}
		var tbl metav1.Table
		if err := json.Unmarshal(raw, &tbl); err != nil {
			return nil, fmt.Errorf("reading the API server's table of %s: %w", t.res.Plural, err)
		}
		for i := range tbl.Rows {
			if r := tbl.Rows[i].Object.Raw; len(r) > 0 {
				var m metav1.PartialObjectMetadata
				if err := json.Unmarshal(r, &m); err == nil {
					tbl.Rows[i].Object.Object = &m
				}
			}
		}
		return &tbl, nil
	}
	if len(t.names) == 0 {
		return list(opts.FieldSelector)
	}
	var all *metav1.Table
	var errs []error
	for _, n := range t.names {
		sel := fields.OneTermEqualSelector("metadata.name", n).String()
		if opts.FieldSelector != "" {
			sel += "," + opts.FieldSelector
		}
		tbl, err := list(sel)
		if err == nil && len(tbl.Rows) == 0 {
			err = apierrors.NewNotFound(t.res.GVR().GroupResource(), n)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if all == nil {
			all = tbl
		} else {
			all.Rows = append(all.Rows, tbl.Rows...)
		}
	}
	return all, errors.Join(errs...)
}

// fetchObjects gets t's objects whole.
func fetchObjects(ctx context.Context, dyn dynamic.Interface, t target, ns string, opts metav1.ListOptions) ([]unstructured.Unstructured, error) {
	ri := dyn.Resource(t.res.GVR()).Namespace(ns)
	if len(t.names) == 0 {
		list, err := ri.List(ctx, opts)
		if err != nil {
			return nil, err
		}
		return list.Items, nil
	}
	var out []unstructured.Unstructured
	var errs []error
	for _, n := range t.names {
		o, err := ri.Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, *o)
	}
	return out, errors.Join(errs...)
}
