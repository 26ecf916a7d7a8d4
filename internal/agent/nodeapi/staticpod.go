package nodeapi

import (
	"path/filepath"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// KubeletKubeconfigFile is the kubeconfig the proxy writes in its folder
// at start for the kubelet: the kubelet's own, pointed at the proxy.
const KubeletKubeconfigFile = "kubelet.conf"

// StaticPodOptions describe the node a static pod of the proxy runs on.
type StaticPodOptions struct {
	// Image is the agent's image.
	Image string
	// UpstreamKubeconfig is the kubelet's own kubeconfig on the node.
	UpstreamKubeconfig string
	// CertDirs hold the files that kubeconfig names (the kubelet's
	// client certificate, its CA), mounted read-only where they are.
	CertDirs []string
	// Dir is the proxy's folder on the node (store, seal key, serving
	// certificate, the kubelet's new kubeconfig).
	Dir    string
	Listen string
	// PodResourcesDir holds the kubelet's pod-resources socket
	// (kubelet.sock); empty: pods are not held back for their devices.
	PodResourcesDir string
}

// StaticPod is the Pod the kubelet runs from its static pod folder, so that
// the proxy runs before the kubelet can learn anything from the API server:
// on the host's network (the kubelet dials loopback), with the node's paths
// mounted where they are on the node, so that the kubeconfig it writes
// names them as the kubelet sees them.
func StaticPod(o StaticPodOptions) *corev1.Pod {
	type mount struct {
		name, path string
		kind       corev1.HostPathType
		readOnly   bool
	}
	mounts := []mount{{"upstream", o.UpstreamKubeconfig, corev1.HostPathFile, true}, {"state", o.Dir, corev1.HostPathDirectoryOrCreate, false}}
	for i, d := range o.CertDirs {
		if d == "" {
			continue
		}
		mounts = append(mounts, mount{"certs-" + strconv.Itoa(i), d, corev1.HostPathDirectory, true})
	}
	podResources := ""
	if o.PodResourcesDir != "" {
		mounts = append(mounts, mount{"pod-resources", o.PodResourcesDir, corev1.HostPathDirectoryOrCreate, false})
		podResources = filepath.Join(o.PodResourcesDir, "kubelet.sock")
	}
	c := corev1.Container{
		Name: "node-api", Image: o.Image, ImagePullPolicy: corev1.PullIfNotPresent,
		Args: []string{"node-api", "--upstream-kubeconfig", o.UpstreamKubeconfig, "--listen", o.Listen, "--dir", o.Dir,
			"--kubelet-kubeconfig", filepath.Join(o.Dir, KubeletKubeconfigFile), "--pod-resources-socket", podResources},
		Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	}
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "dowse-node-api", Namespace: "kube-system", Labels: map[string]string{"app.kubernetes.io/name": "dowse-node-api"}},
		Spec: corev1.PodSpec{
			HostNetwork:       true,
			PriorityClassName: "system-node-critical",
			Containers:        []corev1.Container{c},
		},
	}
	for _, m := range mounts {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: m.name, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: m.path, Type: ptr.To(m.kind)}}})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: m.name, MountPath: m.path, ReadOnly: m.readOnly})
	}
	return pod
}
