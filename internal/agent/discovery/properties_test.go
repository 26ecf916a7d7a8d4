package discovery

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dowse-dev/dowse/internal/agent/propertyrefs"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// values is a valueSource over a map of "Kind ns/name" to keys, with an
// error per object.
type values struct {
	objs map[string]map[string]string
	errs map[string]error
}

func (values) Set(types.NamespacedName, []propertyrefs.Ref) {}

func (v values) Value(ref propertyrefs.Ref, key string) ([]byte, bool, error) {
	if err := v.errs[ref.String()]; err != nil {
		return nil, false, err
	}
	s, ok := v.objs[ref.String()][key]
	return []byte(s), ok, nil
}

func TestResolveProperties(t *testing.T) {
	lit := "literal"
	secret := func(name, ns string, optional bool) v1alpha1.DiscoveryProperty {
		return v1alpha1.DiscoveryProperty{Name: "S_" + ns + name, ValueFrom: &v1alpha1.DiscoveryPropertySource{
			SecretKeyRef: &v1alpha1.ObjectKeyRef{Name: name, Namespace: ns, Key: "k", Optional: optional}}}
	}
	cfg := func(props ...v1alpha1.DiscoveryProperty) *v1alpha1.Configuration {
		return &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: "plant", Name: "c"},
			Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{DiscoveryProperties: props}}}
	}
	src := values{
		objs: map[string]map[string]string{
			"Secret plant/cred": {"k": "pw"}, "Secret other/cred": {"k": "elsewhere"}, "ConfigMap plant/cm": {"url": "opc.tcp://x"},
		},
		errs: map[string]error{
			"Secret plant/late":   propertyrefs.ErrPending,
			"Secret plant/denied": apierrors.NewForbidden(corev1.Resource("secrets"), "denied", errors.New("no rule")),
		},
	}
	got, err := resolveProperties(src, cfg(
		v1alpha1.DiscoveryProperty{Name: "L", Value: &lit}, secret("cred", "", false), secret("cred", "other", false), secret("gone", "", true),
		v1alpha1.DiscoveryProperty{Name: "URL", ValueFrom: &v1alpha1.DiscoveryPropertySource{ConfigMapKeyRef: &v1alpha1.ObjectKeyRef{Name: "cm", Key: "url"}}}))
	if err != nil {
		t.Fatal(err)
	}
	plain := map[string]string{}
	for k, v := range got {
		plain[k] = string(v.Vec)
		if k == "S_gone" && v.Vec != nil {
			t.Errorf("a missing optional property has a value: %v", v)
		}
	}
	if want := map[string]string{"L": "literal", "S_cred": "pw", "S_othercred": "elsewhere", "S_gone": "", "URL": "opc.tcp://x"}; !reflect.DeepEqual(plain, want) {
		t.Errorf("resolved %v, want %v", plain, want)
	}

	for _, c := range []struct {
		name  string
		prop  v1alpha1.DiscoveryProperty
		check func(error) bool
		words string
	}{
		{"missing required", secret("gone", "", false), func(e error) bool { return e != nil }, `Secret plant/gone has no key "k"`},
		{"pending", secret("late", "", false), func(e error) bool { return errors.Is(e, propertyrefs.ErrPending) }, "Secret plant/late"},
		{"forbidden", secret("denied", "", false), apierrors.IsForbidden, "Role " + v1alpha1.PropertyAccessRole + " of namespace plant"},
	} {
		_, err := resolveProperties(src, cfg(c.prop))
		if !c.check(err) || !strings.Contains(fmtErr(err), c.words) || !strings.Contains(fmtErr(err), "discoveryProperties[0]") {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.words)
		}
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestPropertyRefs(t *testing.T) {
	c := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: "plant"}, Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{
		DiscoveryProperties: []v1alpha1.DiscoveryProperty{
			{Name: "a", ValueFrom: &v1alpha1.DiscoveryPropertySource{SecretKeyRef: &v1alpha1.ObjectKeyRef{Name: "s", Key: "k"}}},
			{Name: "b", ValueFrom: &v1alpha1.DiscoveryPropertySource{ConfigMapKeyRef: &v1alpha1.ObjectKeyRef{Name: "s", Key: "k"}}},
		}}}}
	want := []propertyrefs.Ref{
		{Kind: propertyrefs.Secret, NamespacedName: types.NamespacedName{Namespace: "plant", Name: "s"}},
		{Kind: propertyrefs.ConfigMap, NamespacedName: types.NamespacedName{Namespace: "plant", Name: "s"}},
	}
	if got := propertyRefs(c); !reflect.DeepEqual(got, want) {
		t.Errorf("refs %v, want %v", got, want)
	}
}
