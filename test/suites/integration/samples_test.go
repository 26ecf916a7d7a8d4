package integration

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
)

// TestSamplesAreAccepted creates every sample (Configurations and
// DeviceModels, one object a file) on the real API server exactly as
// written, so that a sample a user copies is never refused by the CRD.
// Models go first, as a user applies them.
func TestSamplesAreAccepted(t *testing.T) {
	ns := suite.Namespace(t)
	files, err := filepath.Glob(filepath.Join(kube.RepoRoot(), "samples", "*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("samples: %v %v", files, err)
	}
	var objs []client.Object
	var names []string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(raw, &meta); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var obj client.Object
		switch meta.Kind {
		case "Configuration":
			obj = &v1alpha1.Configuration{}
		case "DeviceModel":
			obj = &v1alpha1.DeviceModel{}
		default:
			t.Fatalf("%s: kind %q is not a sample kind (Configuration, DeviceModel)", filepath.Base(f), meta.Kind)
		}
		if err := yaml.UnmarshalStrict(raw, obj); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		obj.SetNamespace(ns)
		objs = append(objs, obj)
		names = append(names, filepath.Base(f))
	}
	order := make([]int, len(objs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		_, ma := objs[a].(*v1alpha1.DeviceModel)
		_, mb := objs[b].(*v1alpha1.DeviceModel)
		switch {
		case ma && !mb:
			return -1
		case mb && !ma:
			return 1
		}
		return 0
	})
	for _, i := range order {
		if err := suite.Client.Create(t.Context(), objs[i]); err != nil {
			t.Fatalf("%s refused: %v", names[i], err)
		}
	}
}
