// Package lifecycle is what installing, upgrading and uninstalling Dowse
// needs beyond the chart: bringing the CRDs up to date (ApplyCRDs, the
// chart's pre-install and pre-upgrade hook, since Helm never upgrades a
// chart's crds/), taking everything Dowse made away before the chart's
// objects go (Uninstall, the pre-delete hook), and the controller's janitor
// that drops the Configuration finalizers of agents that are gone
// (AgentJanitor), so that nothing is left Terminating when a hook did not
// run.
package lifecycle

import (
	"context"
	"fmt"
	"io/fs"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/deploy/crds"
)

// FieldManager is the field manager of the CRDs ApplyCRDs applies.
const FieldManager = "dowse-crds"

var crdResource = apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")

// CRDs returns the CRDs this binary was built with.
func CRDs() ([]*unstructured.Unstructured, error) {
	files, err := fs.Glob(crds.FS, "*.yaml")
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, f := range files {
		b, err := crds.FS.ReadFile(f)
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, u)
	}
	return out, nil
}

// ApplyCRDs applies the CRDs this binary was built with, server-side and
// taking over every field (Helm created them from the chart's crds/, or an
// earlier ApplyCRDs did), then waits until each is Established with the
// versions it serves. It never deletes a CRD or a version: a version an
// upgrade drops must be left out by a CRD of its own (storage migration).
func ApplyCRDs(ctx context.Context, cfg *rest.Config, log logr.Logger) error {
	objs, err := CRDs()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ext, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if _, err := dyn.Resource(crdResource).Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
			return fmt.Errorf("applying CRD %s: %w", o.GetName(), err)
		}
		log.Info("CRD applied", "crd", o.GetName())
	}
	for _, o := range objs {
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return established(crd), nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", o.GetName(), err)
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
