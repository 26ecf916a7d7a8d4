package mappers

import (
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// TestPod: pinned to its node, the agent's DMI socket folder (and nothing
// else of its state directory: not the node's link key) mounted in every
// container, the socket group given, the registration name set, and a name that changes with the
// spec (so a new template starts a new Pod) but not with the node's length.
func TestPod(t *testing.T) {
	r := NewReconciler(nil, nil, "", 2000, logrDiscard())
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "plc", UID: "u"}}
	spec := &corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "x:1"}, {Name: "b", Image: "y:1"}}}
	p, err := r.pod(cfg, spec, "edge-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "edge-1" || len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].HostPath.Path != DefaultStateDir+"/dmi" {
		t.Fatalf("pod spec %+v: want pinned, with the DMI socket folder alone", p.Spec)
	}
	if sc := p.Spec.SecurityContext; sc == nil || !slices.Equal(sc.SupplementalGroups, []int64{2000}) {
		t.Fatalf("pod security context %+v: want the socket group", sc)
	}
	for _, c := range p.Spec.Containers {
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != DefaultStateDir+"/dmi" || env[EnvMapperName] != "plc" || env[EnvStateDir] != DefaultStateDir {
			t.Errorf("container %s: mounts %v env %v", c.Name, c.VolumeMounts, env)
		}
	}
	if len(spec.Containers[0].Env) != 0 {
		t.Error("pod() changed the template")
	}
	spec.Containers[0].Image = "x:2"
	p2, _ := r.pod(cfg, spec, "edge-1", nil)
	p3, _ := r.pod(cfg, spec, "edge-2", nil)
	if p2.Name == p.Name || p3.Name == p2.Name || p2.Annotations[annotationNode] != "edge-1" {
		t.Errorf("names %s %s %s: want a new name per spec and per node", p.Name, p2.Name, p3.Name)
	}
	long, _ := r.pod(cfg, spec, strings.Repeat("n", 300), nil)
	if len(long.Name) > 253 || long.Labels[v1alpha1.LabelNode] == "" || len(long.Labels[v1alpha1.LabelNode]) > 63 {
		t.Errorf("name %d chars, node label %q: want valid ones for a long node name", len(long.Name), long.Labels[v1alpha1.LabelNode])
	}
}

// TestPodMountsSinkSecrets: each Secret a pushMethod names is mounted
// read-only where the mapper SDK looks, optional, in every container, and
// a new Secret makes a new Pod.
func TestPodMountsSinkSecrets(t *testing.T) {
	r := NewReconciler(nil, nil, "", 0, logrDiscard())
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "plc", UID: "u"}}
	spec := &corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "x:1"}, {Name: "b", Image: "y:1"}}}
	p, err := r.pod(cfg, spec, "edge-1", []string{"mqtt-creds", "http-creds"})
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{}
	for _, v := range p.Spec.Volumes {
		if v.Secret != nil {
			if v.Secret.Optional == nil || !*v.Secret.Optional {
				t.Errorf("secret volume %s not optional", v.Name)
			}
			secrets[v.Name] = v.Secret.SecretName
		}
	}
	for _, c := range p.Spec.Containers {
		got := map[string]bool{}
		for _, m := range c.VolumeMounts {
			if name, ok := secrets[m.Name]; ok && m.ReadOnly && m.MountPath == SinkSecretsDir+"/"+name {
				got[name] = true
			}
		}
		if !got["mqtt-creds"] || !got["http-creds"] {
			t.Errorf("container %s mounts %v (secret volumes %v): want both Secrets read-only under %s", c.Name, c.VolumeMounts, secrets, SinkSecretsDir)
		}
	}
	p2, _ := r.pod(cfg, spec, "edge-1", []string{"mqtt-creds"})
	if p2.Name == p.Name {
		t.Errorf("the same Pod name %s with other Secrets", p.Name)
	}
}

func logrDiscard() logr.Logger { return logr.Discard() }
