package v1alpha1

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestPropertyObjects(t *testing.T) {
	lit := "x"
	sec := func(ns, name string) DiscoveryProperty {
		return DiscoveryProperty{Name: name, ValueFrom: &DiscoveryPropertySource{SecretKeyRef: &ObjectKeyRef{Namespace: ns, Name: name, Key: "k"}}}
	}
	cm := func(ns, name string) DiscoveryProperty {
		return DiscoveryProperty{Name: "cm-" + name, ValueFrom: &DiscoveryPropertySource{ConfigMapKeyRef: &ObjectKeyRef{Namespace: ns, Name: name, Key: "k"}}}
	}
	c := &Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: "plant", Name: "c"}, Spec: ConfigurationSpec{DiscoveryHandler: DiscoveryHandlerSpec{
		DiscoveryProperties: []DiscoveryProperty{
			{Name: "lit", Value: &lit}, sec("", "b"), sec("", "a"), sec("plant", "a"), sec("other", "a"), cm("", "same"), cm("", "same"),
		},
	}}}
	secrets, cms := c.PropertyObjects()
	wantSecrets := []types.NamespacedName{{Namespace: "other", Name: "a"}, {Namespace: "plant", Name: "a"}, {Namespace: "plant", Name: "b"}}
	if !reflect.DeepEqual(secrets, wantSecrets) {
		t.Errorf("secrets %v, want %v", secrets, wantSecrets)
	}
	if want := []types.NamespacedName{{Namespace: "plant", Name: "same"}}; !reflect.DeepEqual(cms, want) {
		t.Errorf("configmaps %v, want %v", cms, want)
	}
	c.DeletionTimestamp = &metav1.Time{}
	if s, m := c.PropertyObjects(); s != nil || m != nil {
		t.Errorf("a deleted configuration reads %v %v", s, m)
	}
	if s, m := (&Configuration{}).PropertyObjects(); len(s) != 0 || len(m) != 0 {
		t.Errorf("no properties read %v %v", s, m)
	}
}
