package dowsectl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/dowsectl/convert"
)

// convertSources are the kinds `convert --from-cluster` reads.
var convertSources = []schema.GroupVersionResource{
	{Group: "akri.sh", Version: "v0", Resource: "configurations"},
	{Group: "devices.kubeedge.io", Version: "v1beta1", Resource: "devicemodels"},
	{Group: "devices.kubeedge.io", Version: "v1beta1", Resource: "devices"},
}

func newConvertCommand(c *cli) *cobra.Command {
	var files []string
	var fromCluster, allNamespaces bool
	cmd := &cobra.Command{
		Use:   "convert (-f FILE... | --from-cluster)",
		Short: "Write Akri's Configurations and KubeEdge's DeviceModels and Devices as Dowse's",
		Long: `Read Akri Configurations (akri.sh/v0) and KubeEdge DeviceModels and Devices
(devices.kubeedge.io/v1beta1), from files or from the cluster, and write
Dowse's Configurations, DeviceModels and Devices to standard output, to
apply with kubectl. What could not be carried over, and why, is said on
standard error. Akri's discovery handlers and KubeEdge's mappers then run
unchanged against them.`,
		Example: `  kubectl dowse convert -f akri-onvif.yaml > dowse-onvif.yaml
  kubectl dowse convert --from-cluster -A | kubectl apply -f -`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (len(files) == 0) == !fromCluster {
				return usageErrorf("give -f FILE (- for standard input) or --from-cluster")
			}
			var objs []*unstructured.Unstructured
			for _, f := range files {
				got, err := readObjects(f, c.streams.In)
				if err != nil {
					return err
				}
				objs = append(objs, got...)
			}
			if fromCluster {
				got, err := c.clusterObjects(cmd.Context(), allNamespaces)
				if err != nil {
					return err
				}
				objs = append(objs, got...)
			}
			res, err := convert.Convert(objs)
			if err != nil {
				return err
			}
			for i, o := range res.Objects {
				raw, err := yaml.Marshal(o)
				if err != nil {
					return err
				}
				if i > 0 {
					fmt.Fprintln(c.streams.Out, "---")
				}
				if _, err := c.streams.Out.Write(stripEmpty(raw)); err != nil {
					return err
				}
			}
			for _, n := range res.Notes {
				fmt.Fprintln(c.streams.ErrOut, "note:", n)
			}
			fmt.Fprintf(c.streams.ErrOut, "converted %d of %d objects, %d notes\n", len(res.Objects), len(objs), len(res.Notes))
			return nil
		},
	}
	cmd.Flags().StringSliceVarP(&files, "filename", "f", nil, "files of Akri or KubeEdge objects (YAML or JSON, several documents or a List; - for standard input)")
	cmd.Flags().BoolVar(&fromCluster, "from-cluster", false, "read Akri's and KubeEdge's objects from the cluster")
	cmd.Flags().BoolVarP(&allNamespaces, "all-namespaces", "A", false, "with --from-cluster, every namespace")
	return cmd
}

// stripEmpty drops the empty fields a typed object marshals
// (creationTimestamp: null, status: {}).
func stripEmpty(raw []byte) []byte {
	var m map[string]any
	if yaml.Unmarshal(raw, &m) != nil {
		return raw
	}
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	if st, ok := m["status"].(map[string]any); ok && len(st) == 0 {
		delete(m, "status")
	}
	if out, err := yaml.Marshal(m); err == nil {
		return out
	}
	return raw
}

// readObjects reads every object of a YAML or JSON file, Lists flattened.
func readObjects(path string, stdin io.Reader) ([]*unstructured.Unstructured, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(r), 4096)
	var out []*unstructured.Unstructured
	for i := 0; ; i++ {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: document %d: %w", path, i+1, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.IsList() {
			if err := u.EachListItem(func(o runtime.Object) error {
				item, ok := o.(*unstructured.Unstructured)
				if !ok {
					return fmt.Errorf("list item is a %T", o)
				}
				out = append(out, item)
				return nil
			}); err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", path, i+1, err)
			}
			continue
		}
		out = append(out, u)
	}
}

// clusterObjects lists Akri's and KubeEdge's objects; a kind the cluster
// does not serve is left out.
func (c *cli) clusterObjects(ctx context.Context, all bool) ([]*unstructured.Unstructured, error) {
	dyn, err := c.dynamic()
	if err != nil {
		return nil, err
	}
	ns := metav1.NamespaceAll
	if !all {
		if ns, err = c.namespace(); err != nil {
			return nil, err
		}
	}
	var out []*unstructured.Unstructured
	for _, gvr := range convertSources {
		l, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", gvr.GroupResource(), err)
		}
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	}
	return out, nil
}
