package node

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// keptByUninstall are what `helm uninstall` leaves in the release's
// namespace on purpose or what Kubernetes itself keeps there: the link CA
// and its published certificate (the controller's, not the release's: a
// reinstall must not lock the edges out), the namespace's root CA
// ConfigMap and default ServiceAccount, Events.
var keptByUninstall = []string{"Secret/dowse-link-ca", "ConfigMap/dowse-link-ca-cert", "ConfigMap/kube-root-ca.crt", "ServiceAccount/default"}

// waitUninstalled fails unless, within a minute, nothing of the release is
// left: every object of every listable resource in ns (but keptByUninstall
// and Events), every object anywhere labelled
// app.kubernetes.io/part-of=dowse, and every dowse.dev object. It asks the
// API server which resources it serves, so a kind the chart starts making
// is covered without a change here.
func waitUninstalled(t *testing.T, ctx context.Context, cfg *rest.Config, ns string) {
	t.Helper()
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lists, err := disco.ServerPreferredResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		t.Fatal(err)
	}
	var left []string
	for deadline := time.Now().Add(time.Minute); ; {
		left = left[:0]
		for _, l := range lists {
			gv, err := schema.ParseGroupVersion(l.GroupVersion)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range l.APIResources {
				// Events stay by design; Endpoints mirror EndpointSlices and
				// ComponentStatuses are no objects (both deprecated).
				if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") || slices.Contains([]string{"Event", "Endpoints", "ComponentStatus"}, r.Kind) {
					continue
				}
				res := dyn.Resource(gv.WithResource(r.Name))
				var queries []func() ([]string, error)
				list := func(ri dynamic.ResourceInterface, opts metav1.ListOptions) func() ([]string, error) {
					return func() ([]string, error) {
						items, err := ri.List(ctx, opts)
						if err != nil {
							return nil, err
						}
						var out []string
						for _, it := range items.Items {
							name := r.Kind + "/" + it.GetName()
							if it.GetNamespace() == ns && slices.Contains(keptByUninstall, name) {
								continue
							}
							if it.GetNamespace() != "" {
								name = it.GetNamespace() + "/" + name
							}
							out = append(out, name)
						}
						return out, nil
					}
				}
				switch {
				case gv.Group == "dowse.dev":
					queries = append(queries, list(res, metav1.ListOptions{}))
				case r.Namespaced:
					queries = append(queries, list(res.Namespace(ns), metav1.ListOptions{}),
						list(res, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=dowse"}))
				default:
					queries = append(queries, list(res, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=dowse"}))
				}
				for _, q := range queries {
					names, err := q()
					if err != nil {
						t.Fatalf("listing %s: %v", gv.WithResource(r.Name), err)
					}
					for _, n := range names {
						if !slices.Contains(left, n) {
							left = append(left, n)
						}
					}
				}
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("left behind after helm uninstall: %v", left)
		}
		time.Sleep(time.Second)
	}
}
