package deviceplugin

import (
	"context"
	"os"
	"testing"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// TestDRAOnlyConfigurationGetsNoPlugin: an Instance of a Configuration
// whose spec.allocation is DRA gets no device plugin, and its CDI spec is
// left alone (internal/agent/dra keeps it).
func TestDRAOnlyConfigurationGetsNoPlugin(t *testing.T) {
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	inst := testInstance("debug-echo-a1b2c3")
	inst.Status.Nodes = []v1alpha1.InstanceNode{{Name: "n1"}}
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "debug-echo", Namespace: "default"},
		Spec: v1alpha1.ConfigurationSpec{Allocation: v1alpha1.AllocationDRA}}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(inst, cfg).Build()
	cdiDir := t.TempDir()
	m, err := NewManager(c, Options{NodeName: "n1", PluginDir: t.TempDir(), CDIDir: cdiDir}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	close(m.started)
	// A spec internal/agent/dra wrote: it must stay.
	if err := m.cdi.Write(inst); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(inst)}); err != nil {
		t.Fatal(err)
	}
	if len(m.instances) != 0 || len(m.configs) != 0 {
		t.Fatalf("plugins for a DRA Configuration: %v %v", m.instances, m.configs)
	}
	if ents, _ := os.ReadDir(cdiDir); len(ents) != 1 {
		t.Fatalf("CDI spec directory holds %d files, want internal/agent/dra's one", len(ents))
	}
}
