package brokers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// DeviceClaim is the name, in a broker Pod of a DRA Configuration, of the
// pod's ResourceClaim for its Instance's device (spec.resourceClaims), which
// the containers that asked for the placeholder resource use.
const DeviceClaim = "dowse-device"

// usesClaims says whether cfg's brokers get their device through a
// ResourceClaim: spec.allocation DRA. With Both they keep the device
// plugin's resource.
func usesClaims(cfg *v1alpha1.Configuration) bool {
	return cfg.Spec.Allocation == v1alpha1.AllocationDRA
}

// ClaimTemplateName is the ResourceClaimTemplate of an Instance's brokers
// (in its namespace): each broker Pod gets a claim of its own from it, one
// slot of the device's capacity, as a device plugin slot would be.
func ClaimTemplateName(instance string) string { return instance }

// ClaimTemplate is the ResourceClaimTemplate of inst's brokers (and of a
// mapper Pod that needs the device): one device of the Configuration's
// DeviceClass, the one whose instance attribute is inst's name. Owned by
// the Instance.
func ClaimTemplate(inst *v1alpha1.Instance) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{
			Name: ClaimTemplateName(inst.Name), Namespace: inst.Namespace,
			Labels: labels(inst, ""), OwnerReferences: owner(inst),
		},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "device", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: shareddra.DeviceClassName(inst.Namespace, inst.Spec.ConfigurationName),
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf("device.attributes[%q].%s == %q", shareddra.DriverName, shareddra.AttrInstance, inst.Name),
				}}},
			}}},
		}}},
	}
}

// withClaim returns a copy of spec whose containers that asked for the
// placeholder resource (in requests or limits) use the pod claim
// DeviceClaim from template instead, the first container when none did.
func withClaim(spec *corev1.PodSpec, template string) *corev1.PodSpec {
	out := spec.DeepCopy()
	replaced := false
	strip := func(c *corev1.Container) {
		found := false
		for _, l := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			for name := range l {
				if name == Placeholder || name == corev1.ResourceName(v1alpha1.LegacyResourceName(Placeholder)) {
					delete(l, name)
					found = true
				}
			}
		}
		if found {
			c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: DeviceClaim})
			replaced = true
		}
	}
	for _, cs := range [][]corev1.Container{out.InitContainers, out.Containers} {
		for i := range cs {
			strip(&cs[i])
		}
	}
	if !replaced && len(out.Containers) > 0 {
		out.Containers[0].Resources.Claims = append(out.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: DeviceClaim})
	}
	out.ResourceClaims = append(out.ResourceClaims, corev1.PodResourceClaim{Name: DeviceClaim, ResourceClaimTemplateName: &template})
	return out
}

// ensureClaimTemplate creates inst's ResourceClaimTemplate once (its spec
// never changes: the Instance's name and Configuration are fixed). The
// owner reference collects it with the Instance; removeAll deletes it too.
// Returns the API server's message when it refused the template.
func (r *InstanceReconciler) ensureClaimTemplate(ctx context.Context, inst *v1alpha1.Instance) (string, error) {
	key := types.NamespacedName{Namespace: inst.Namespace, Name: inst.Name}
	if uid, ok := r.templates.Load(key); ok && uid == inst.UID {
		return "", nil
	}
	err := r.client.Create(ctx, ClaimTemplate(inst))
	switch {
	case err == nil, apierrors.IsAlreadyExists(err):
		r.templates.Store(key, inst.UID)
		return "", nil
	case apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err):
		msg := fmt.Sprintf("broker claim template %s refused: %v", inst.Name, err)
		r.recorder.Eventf(inst, nil, corev1.EventTypeWarning, "BrokerRefused", "CreateBroker", "%s", msg)
		return msg, nil
	}
	return "", err
}

// removeClaimTemplate deletes the template of the Instance namespace/name.
func (r *InstanceReconciler) removeClaimTemplate(ctx context.Context, namespace, instance string) error {
	r.templates.Delete(types.NamespacedName{Namespace: namespace, Name: instance})
	t := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: ClaimTemplateName(instance)}}
	return client.IgnoreNotFound(r.client.Delete(ctx, t))
}
