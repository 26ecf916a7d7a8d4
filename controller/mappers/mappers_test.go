package mappers

import (
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// TestPod: pinned to its node, the state directory mounted in every
// container, the registration name set, and a name that changes with the
// spec (so a new template starts a new Pod) but not with the node's length.
func TestPod(t *testing.T) {
	r := NewReconciler(nil, nil, "", logrDiscard())
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "plc", UID: "u"}}
	spec := &corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "x:1"}, {Name: "b", Image: "y:1"}}}
	p, err := r.pod(cfg, spec, "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "edge-1" || len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].HostPath.Path != DefaultStateDir {
		t.Fatalf("pod spec %+v: want pinned, with the state directory", p.Spec)
	}
	for _, c := range p.Spec.Containers {
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		if len(c.VolumeMounts) != 1 || env[EnvMapperName] != "plc" || env[EnvStateDir] != DefaultStateDir {
			t.Errorf("container %s: mounts %v env %v", c.Name, c.VolumeMounts, env)
		}
	}
	if len(spec.Containers[0].Env) != 0 {
		t.Error("pod() changed the template")
	}
	spec.Containers[0].Image = "x:2"
	p2, _ := r.pod(cfg, spec, "edge-1")
	p3, _ := r.pod(cfg, spec, "edge-2")
	if p2.Name == p.Name || p3.Name == p2.Name || p2.Annotations[annotationNode] != "edge-1" {
		t.Errorf("names %s %s %s: want a new name per spec and per node", p.Name, p2.Name, p3.Name)
	}
	long, _ := r.pod(cfg, spec, strings.Repeat("n", 300))
	if len(long.Name) > 253 || long.Labels[v1alpha1.LabelNode] == "" || len(long.Labels[v1alpha1.LabelNode]) > 63 {
		t.Errorf("name %d chars, node label %q: want valid ones for a long node name", len(long.Name), long.Labels[v1alpha1.LabelNode])
	}
}

func logrDiscard() logr.Logger { return logr.Discard() }
