package e2e

import (
	"context"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dowse-dev/dowse/test/framework/kube"
)

// controlPlane starts an API server with Dowse's CRDs for t, with the
// controller's namespace dowse-system, and returns t's folder, a
// kubeconfig for the binaries in it, a clientset and the control plane.
func controlPlane(t *testing.T) (dir, kubeconfig string, cs kubernetes.Interface, cp *kube.ControlPlane) {
	t.Helper()
	cp, err := kube.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	dir = t.TempDir()
	kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := cp.Kubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	if cs, err = kubernetes.NewForConfig(cp.Config); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dowse-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return dir, kubeconfig, cs, cp
}
