package propertyaccess_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// scopedSA is the controller service account of the chart rendered with
// rbac.configurationNamespaces; its cluster-wide objects are renamed with
// this name so they sit beside the default install's.
const scopedSA = "dowse-controller-scoped"

// With rbac.configurationNamespaces the controller holds no read of
// Secrets across the cluster, yet grants the agents what Configurations of
// those namespaces name; a Configuration made elsewhere is refused at
// admission and, should one get in, granted nothing.
func TestControllerReadsSecretsOnlyWhereConfigurationsAre(t *testing.T) {
	accounts := installRBAC(t)
	served, other := suite.Namespace(t), suite.Namespace(t)
	installScopedRBAC(t, "--set", "rbac.configurationNamespaces={"+served+"}", "--set", "controller.serviceAccount.name="+scopedSA)

	sa := "system:serviceaccount:" + releaseNamespace + ":" + scopedSA
	for _, c := range []struct {
		ns, verb string
		want     bool
	}{{"", "list", false}, {other, "get", false}, {other, "list", false}, {served, "get", true}, {served, "watch", true}} {
		if got := may(t, sa, c.ns, c.verb, "secrets"); got != c.want {
			t.Errorf("the scoped controller may %s secrets in %q: %v, want %v", c.verb, c.ns, got, c.want)
		}
	}

	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "payroll"}, Data: map[string][]byte{"k": []byte("not yours")}})
	startControllerAs(t, controllerConfig(t, scopedSA), accounts, []string{served})
	createConfiguration(t, served, "camera", v1alpha1.DiscoveryProperty{Name: "PASSWORD", ValueFrom: secretRef("camera", "k")})
	expectRules(t, served, []string{"camera"}, nil)
	createConfiguration(t, other, "elsewhere", v1alpha1.DiscoveryProperty{Name: "PAYROLL", ValueFrom: secretRef("payroll", "k")})
	testwait.Holds(t, 3*time.Second, func() error {
		if r := role(t, other); r != nil {
			return fmt.Errorf("the agents were granted %v in %s, where Configurations are not served", r.Rules, other)
		}
		return nil
	})
	// The controller keeps serving its namespace meanwhile.
	createConfiguration(t, served, "plc", v1alpha1.DiscoveryProperty{Name: "TOKEN", ValueFrom: configMapRef("plc", "k")})
	expectRules(t, served, []string{"camera"}, []string{"plc"})

	installPolicy(t, "--set", "rbac.configurationNamespaces={"+served+"}")
	refused := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "refused"},
		Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{Name: handlerName}}}
	testwait.For(t, 20*time.Second, func() error {
		err := suite.Client.Create(t.Context(), refused.DeepCopy(), client.DryRunAll)
		if err == nil {
			return fmt.Errorf("a Configuration in %s was admitted", other)
		}
		if !strings.Contains(err.Error(), "served only in the namespaces "+served) || !strings.Contains(err.Error(), "not "+other) {
			t.Fatalf("refused with %v, want the namespaces served and this one named", err)
		}
		return nil
	})
	ok := refused.DeepCopy()
	ok.Namespace = served
	if err := suite.Client.Create(t.Context(), ok, client.DryRunAll); err != nil {
		t.Errorf("a Configuration in %s was refused: %v", served, err)
	}
	// One made before the policy may still be updated (its finalizers
	// taken off, so it can go).
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var before v1alpha1.Configuration
		if err := suite.Client.Get(t.Context(), client.ObjectKey{Namespace: other, Name: "elsewhere"}, &before); err != nil {
			return err
		}
		before.Labels = map[string]string{"touched": "yes"}
		return suite.Client.Update(t.Context(), &before, client.DryRunAll)
	}); err != nil {
		t.Errorf("updating a Configuration made before the policy: %v", err)
	}
}

// installScopedRBAC creates the chart's controller RBAC rendered with set,
// its cluster-wide objects and leader-election Role renamed to scopedSA,
// removed when the test ends.
func installScopedRBAC(t *testing.T, set ...string) {
	t.Helper()
	for _, o := range render(t, set...) {
		switch {
		case o.GetKind() == "ServiceAccount" && o.GetName() == scopedSA:
		case o.GetKind() == "ClusterRole" && o.GetName() == controllerSA:
		case o.GetKind() == "ClusterRoleBinding" && o.GetName() == controllerSA:
		case (o.GetKind() == "Role" || o.GetKind() == "RoleBinding") && strings.HasPrefix(o.GetName(), "dowse-controller-"):
		default:
			continue
		}
		if o.GetName() == controllerSA || o.GetName() == "dowse-controller-leader-election" {
			o.SetName(scopedSA + strings.TrimPrefix(o.GetName(), controllerSA))
		}
		if ref, ok, _ := unstructured.NestedString(o.Object, "roleRef", "name"); ok && (ref == controllerSA || ref == "dowse-controller-leader-election") {
			_ = unstructured.SetNestedField(o.Object, scopedSA+strings.TrimPrefix(ref, controllerSA), "roleRef", "name")
		}
		if err := suite.Client.Create(t.Context(), o); err != nil {
			t.Fatalf("creating %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
		t.Cleanup(func() {
			if err := suite.Client.Delete(context.Background(), o); client.IgnoreNotFound(err) != nil {
				t.Error(err)
			}
		})
	}
	if _, err := suite.Clientset.CoreV1().ServiceAccounts(releaseNamespace).Get(t.Context(), scopedSA, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		t.Fatalf("the chart rendered no service account %s", scopedSA)
	}
}

// may asks the API server whether user may verb resource in ns ("": every
// namespace).
func may(t *testing.T, user, ns, verb, resource string) bool {
	t.Helper()
	r, err := suite.Clientset.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: user, Groups: []string{"system:serviceaccounts", "system:authenticated"},
		ResourceAttributes: &authzv1.ResourceAttributes{Namespace: ns, Verb: verb, Resource: resource},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.Allowed
}
