package integration

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/kube"
)

// TestSamplesAreAccepted creates every sample Configuration on the real API
// server, so that a sample a user copies is never refused by the CRD.
func TestSamplesAreAccepted(t *testing.T) {
	ns := namespace(t)
	files, err := filepath.Glob(filepath.Join(kube.RepoRoot(), "samples", "*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("samples: %v %v", files, err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var cfg v1alpha1.Configuration
		if err := yaml.UnmarshalStrict(raw, &cfg); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		cfg.Namespace = ns
		if err := k8sClient.Create(t.Context(), &cfg); err != nil {
			t.Fatalf("%s refused: %v", filepath.Base(f), err)
		}
	}
}
