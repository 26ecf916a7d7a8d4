package brokers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

func TestWithClaim(t *testing.T) {
	spec := &corev1.PodSpec{Containers: []corev1.Container{
		{Name: "a", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{Placeholder: resource.MustParse("1"), corev1.ResourceCPU: resource.MustParse("1")}}},
		{Name: "b"},
	}}
	out := withClaim(spec, "cams-0123")
	if _, ok := spec.Containers[0].Resources.Limits[Placeholder]; !ok {
		t.Fatal("the Configuration's spec was changed")
	}
	a := out.Containers[0]
	if _, ok := a.Resources.Limits[Placeholder]; ok || len(a.Resources.Limits) != 1 {
		t.Errorf("limits %v", a.Resources.Limits)
	}
	if len(a.Resources.Claims) != 1 || a.Resources.Claims[0].Name != DeviceClaim || len(out.Containers[1].Resources.Claims) != 0 {
		t.Errorf("claims %v %v", a.Resources.Claims, out.Containers[1].Resources.Claims)
	}
	if len(out.ResourceClaims) != 1 || out.ResourceClaims[0].Name != DeviceClaim || *out.ResourceClaims[0].ResourceClaimTemplateName != "cams-0123" {
		t.Errorf("pod claims %+v", out.ResourceClaims)
	}
	// Without a placeholder the first container gets the claim.
	if out := withClaim(&corev1.PodSpec{Containers: []corev1.Container{{Name: "x"}}}, "t"); len(out.Containers[0].Resources.Claims) != 1 {
		t.Errorf("no placeholder: %+v", out.Containers[0].Resources)
	}
}

func TestBrokerPodOfDRAConfiguration(t *testing.T) {
	inst := &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: "cams-0123", Namespace: "plant", UID: "u"},
		Spec: v1alpha1.InstanceSpec{ConfigurationName: "cams"}}
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "cams", Namespace: "plant"}}
	cfg.Spec.BrokerSpec = &v1alpha1.BrokerSpec{BrokerPodSpec: &corev1.PodSpec{Containers: []corev1.Container{{Name: "b"}}}}
	plugin := brokerPod(inst, cfg, "n1")
	cfg.Spec.Allocation = v1alpha1.AllocationDRA
	dra := brokerPod(inst, cfg, "n1")
	if len(dra.Spec.ResourceClaims) != 1 || len(dra.Spec.Containers[0].Resources.Limits) != 0 {
		t.Errorf("DRA broker %+v", dra.Spec)
	}
	if plugin.Annotations[v1alpha1.AnnotationSpecHash] == dra.Annotations[v1alpha1.AnnotationSpecHash] {
		t.Error("changing the allocation does not roll the brokers")
	}
	tmpl := ClaimTemplate(inst)
	req := tmpl.Spec.Spec.Devices.Requests[0].Exactly
	if tmpl.Name != "cams-0123" || tmpl.Namespace != "plant" || req.DeviceClassName != "cams.plant.dowse.dev" ||
		req.Selectors[0].CEL.Expression != `device.attributes["dowse.dev"].instance == "cams-0123"` || tmpl.OwnerReferences[0].UID != "u" {
		t.Errorf("template %+v", tmpl)
	}
}
