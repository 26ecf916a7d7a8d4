package propertyaccess_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// A Configuration's author who may not read another namespace's Secrets
// cannot have the agents read them for him: without the chart's policy the
// controller grants nothing there; with it the Configuration is refused at
// admission, saying why; a namespace the administrator allows is served.
func TestReferencesStayInTheirNamespace(t *testing.T) {
	literal := "x"
	accounts := installRBAC(t)
	ns, other := suite.Namespace(t), suite.Namespace(t)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "payroll"}, Data: map[string][]byte{"k": []byte("not yours")}})
	startController(t, accounts)

	t.Run("the controller grants nothing in another namespace", func(t *testing.T) {
		createConfiguration(t, ns, "reach-out",
			v1alpha1.DiscoveryProperty{Name: "PAYROLL", ValueFrom: &v1alpha1.DiscoveryPropertySource{SecretKeyRef: &v1alpha1.ObjectKeyRef{Namespace: other, Name: "payroll", Key: "k"}}},
			v1alpha1.DiscoveryProperty{Name: "OWN", ValueFrom: secretRef("own", "k")})
		// The grant of its own namespace's object comes; none appears in
		// the other namespace meanwhile or after.
		expectRules(t, ns, []string{"own"}, nil)
		testwait.Holds(t, 3*time.Second, func() error {
			if r := role(t, other); r != nil {
				return fmt.Errorf("the controller granted the agents %v in %s for a Configuration of %s", r.Rules, other, ns)
			}
			return nil
		})
	})

	t.Run("the policy refuses the reference at admission", func(t *testing.T) {
		installPolicy(t)
		cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "refused"},
			Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{Name: handlerName, DiscoveryProperties: []v1alpha1.DiscoveryProperty{
				{Name: "OWN", ValueFrom: &v1alpha1.DiscoveryPropertySource{ConfigMapKeyRef: &v1alpha1.ObjectKeyRef{Namespace: ns, Name: "own", Key: "k"}}},
				{Name: "PAYROLL", ValueFrom: &v1alpha1.DiscoveryPropertySource{SecretKeyRef: &v1alpha1.ObjectKeyRef{Namespace: other, Name: "payroll", Key: "k"}}},
			}}}}
		// The policy takes effect once the API server has loaded it.
		testwait.For(t, 20*time.Second, func() error {
			err := suite.Client.Create(t.Context(), cfg.DeepCopy(), client.DryRunAll)
			if err == nil {
				return fmt.Errorf("a Configuration naming Secret %s/payroll was admitted", other)
			}
			if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "Secret "+other+"/payroll") || !strings.Contains(err.Error(), "only in the Configuration's namespace "+ns) {
				t.Fatalf("refused with %v, want the reference named and the namespace it may read", err)
			}
			return nil
		})
		// Its own namespace's objects, named with or without the
		// namespace, are admitted.
		ok := cfg.DeepCopy()
		ok.Spec.DiscoveryHandler.DiscoveryProperties = ok.Spec.DiscoveryHandler.DiscoveryProperties[:1]
		ok.Spec.DiscoveryHandler.DiscoveryProperties = append(ok.Spec.DiscoveryHandler.DiscoveryProperties, v1alpha1.DiscoveryProperty{Name: "BARE", ValueFrom: secretRef("own", "k")},
			v1alpha1.DiscoveryProperty{Name: "LITERAL", Value: &literal})
		if err := suite.Client.Create(t.Context(), ok, client.DryRunAll); err != nil {
			t.Errorf("a Configuration reading its own namespace was refused: %v", err)
		}
	})

	t.Run("a namespace the administrator allows is served", func(t *testing.T) {
		installPolicy(t, "--set", "rbac.propertyNamespaces={"+other+"}")
		cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shared-cred"},
			Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{Name: handlerName, DiscoveryProperties: []v1alpha1.DiscoveryProperty{
				{Name: "PAYROLL", ValueFrom: &v1alpha1.DiscoveryPropertySource{SecretKeyRef: &v1alpha1.ObjectKeyRef{Namespace: other, Name: "payroll", Key: "k"}}},
			}}}}
		testwait.For(t, 20*time.Second, func() error {
			return suite.Client.Create(t.Context(), cfg.DeepCopy(), client.DryRunAll)
		})
	})
}

// installPolicy creates the chart's configuration policy and its binding,
// removed when the test ends (the suite's other tests run without it).
func installPolicy(t *testing.T, set ...string) {
	t.Helper()
	cmd := kube.HelmCommand(t.Context(), t, append([]string{"template", "dowse", filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse"),
		"--namespace", releaseNamespace, "--show-only", "templates/configuration-policy.yaml"}, set...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	for _, doc := range bytes.Split(out, []byte("\n---")) {
		var m map[string]any
		if err := utilyaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		if len(m) == 0 {
			continue
		}
		o := &unstructured.Unstructured{Object: m}
		if err := suite.Client.Create(t.Context(), o); err != nil {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		t.Cleanup(func() { _ = suite.Client.Delete(context.Background(), o) })
	}
}
