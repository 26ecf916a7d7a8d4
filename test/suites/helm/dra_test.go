package helm

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestAgentDRA: agent.dra starts the agents with --dra and the kubelet's
// plugin folders, each mounted at its host path (the kubelet dials the
// plugin's socket at the path the plugin registers); the API server takes
// the rendering.
func TestAgentDRA(t *testing.T) {
	const ns = "dowse-dra"
	objs := render(t, ns, "--set", "agent.dra=true", "--set", "kubeletDir=/var/lib/k")
	dryRun(t, ns, objs)
	ds := index(objs)["DaemonSet/dowse-agent"]
	if ds == nil {
		t.Fatal("no agent DaemonSet")
	}
	args := containerArgs(t, ds, "agent")
	for _, w := range []string{"--dra", "--dra-registrar-dir=/var/lib/k/plugins_registry", "--dra-plugin-dir=/var/lib/k/plugins/dowse.dev"} {
		if !slices.Contains(args, w) {
			t.Errorf("agent args %v lack %s", args, w)
		}
	}
	spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
	var ps corev1.PodSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &ps); err != nil {
		t.Fatal(err)
	}
	host := map[string]string{}
	for _, v := range ps.Volumes {
		if v.HostPath != nil {
			host[v.Name] = v.HostPath.Path
		}
	}
	found := 0
	for _, m := range ps.Containers[0].VolumeMounts {
		if m.MountPath == "/var/lib/k/plugins_registry" || m.MountPath == "/var/lib/k/plugins/dowse.dev" {
			found++
			if host[m.Name] != m.MountPath {
				t.Errorf("%s mounted at %s from host %q", m.Name, m.MountPath, host[m.Name])
			}
		}
	}
	if found != 2 {
		t.Errorf("%d of the kubelet's DRA folders mounted", found)
	}
	// Off by default.
	if args := containerArgs(t, index(render(t, ns))["DaemonSet/dowse-agent"], "agent"); slices.Contains(args, "--dra") {
		t.Errorf("default agent args %v have --dra", args)
	}
}
