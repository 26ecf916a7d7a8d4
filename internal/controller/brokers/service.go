package brokers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/apply"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// FieldManager is the controller's server-side-apply field manager.
const FieldManager = "dowse-controller"

// service is a Service made from a user's spec, selecting brokers by sel.
func service(name, namespace string, spec *corev1.ServiceSpec, lbls, sel map[string]string, owners []metav1.OwnerReference) *corev1.Service {
	s := spec.DeepCopy()
	s.Selector = sel
	ann := map[string]string{v1alpha1.AnnotationSpecHash: specHash(struct {
		Spec   *corev1.ServiceSpec
		Labels map[string]string
	}{s, lbls})}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: lbls, Annotations: ann, OwnerReferences: owners},
		Spec:       *s,
	}
}

// ensureService makes the Service at key match want, or removes it when
// want is nil. It writes only when the recorded spec hash differs; the
// apply leaves fields the API server fills in (clusterIP) alone.
func ensureService(ctx context.Context, c client.Client, key types.NamespacedName, want *corev1.Service) error {
	var cur corev1.Service
	err := c.Get(ctx, key, &cur)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	exists := err == nil
	if want == nil {
		if exists && cur.DeletionTimestamp.IsZero() {
			return client.IgnoreNotFound(c.Delete(ctx, &cur))
		}
		return nil
	}
	if exists && cur.Annotations[v1alpha1.AnnotationSpecHash] == want.Annotations[v1alpha1.AnnotationSpecHash] {
		return nil
	}
	// The user's ServiceSpec is carried over whole (apply.FromObject): it
	// is theirs, and any field of it may be set.
	ac := corev1ac.Service(key.Name, key.Namespace)
	if err := apply.FromObject(want, ac); err != nil {
		return err
	}
	return c.Apply(ctx, ac, client.FieldOwner(FieldManager), client.ForceOwnership)
}
