// Package propertyaccess_test proves, on a real API server with the
// chart's RBAC and real service account tokens, that an agent reads the
// Secrets and ConfigMaps its Configurations' discoveryProperties name and
// nothing else: the controller (internal/controller/propertyaccess, under the
// controller's own credentials) grants exactly those by name, the agent
// (internal/agent/propertyrefs, under a pod-bound token of the agent DaemonSet's
// service account) reads them by name and follows their changes.
package propertyaccess_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dowse-dev/dowse/test/framework/kube"
)

// The release as the test installs it.
const (
	releaseNamespace = "dowse-system"
	agentSA          = "dowse-agent"
	controllerSA     = "dowse-controller"
)

var suite = &kube.Suite{NamespacePrefix: "plant-"}

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

// render runs bin/helm template on the chart with the agent's and the
// controller's templates. Without bin/helm the test is skipped, or fails
// under CI (CI=true).
func render(t *testing.T, set ...string) []*unstructured.Unstructured {
	t.Helper()
	cmd := kube.HelmCommand(t.Context(), t, append([]string{"template", "dowse", filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse"),
		"--namespace", releaseNamespace, "--show-only", "templates/agent.yaml", "--show-only", "templates/controller.yaml"}, set...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := utilyaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

var (
	installOnce sync.Once
	installed   struct {
		agentAccounts []string // the controller's --agent-service-accounts, from the chart
		err           error
	}
)

// installRBAC creates the chart's service accounts, roles and bindings of
// the agent and the controller (nothing else: no workload runs), once, and
// returns the agent service accounts the chart's controller Deployment
// names in --agent-service-accounts.
func installRBAC(t *testing.T) []string {
	t.Helper()
	objs := render(t)
	installOnce.Do(func() {
		ctx := context.Background()
		if err := suite.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
			installed.err = err
			return
		}
		for _, o := range objs {
			switch o.GetKind() {
			case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
				if err := suite.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
					installed.err = fmt.Errorf("creating %s %s: %w", o.GetKind(), o.GetName(), err)
					return
				}
			case "Deployment":
				containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
				for _, c := range containers {
					args, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "args")
					for _, a := range args {
						if v, ok := strings.CutPrefix(a, "--agent-service-accounts="); ok && v != "" {
							installed.agentAccounts = strings.Split(v, ",")
						}
					}
				}
			}
		}
		if installed.agentAccounts == nil {
			installed.err = errors.New("the chart's controller has no --agent-service-accounts")
		}
	})
	if installed.err != nil {
		t.Fatal(installed.err)
	}
	return installed.agentAccounts
}

// withToken is a client config of the API server authenticating with
// token alone.
func withToken(token string) *rest.Config {
	c := rest.AnonymousClientConfig(suite.Config)
	c.BearerToken = token
	return c
}

// controllerConfig authenticates as the controller service account sa.
func controllerConfig(t *testing.T, sa string) *rest.Config {
	t.Helper()
	tr, err := suite.Clientset.CoreV1().ServiceAccounts(releaseNamespace).CreateToken(t.Context(), sa, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return withToken(tr.Status.Token)
}

// agentConfig authenticates as the agent DaemonSet's pod on node: a token
// bound to a pod of the agent service account that names the node, as the
// kubelet projects it (no kubelet runs the pod).
func agentConfig(t *testing.T, node string) *rest.Config {
	t.Helper()
	ctx := t.Context()
	if _, err := suite.Clientset.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := suite.Clientset.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	pod, err := suite.Clientset.CoreV1().Pods(releaseNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: agentSA + "-"},
		Spec: corev1.PodSpec{ServiceAccountName: agentSA, NodeName: node,
			Containers: []corev1.Container{{Name: "agent", Image: "dowse-agent"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := suite.Clientset.CoreV1().ServiceAccounts(releaseNamespace).CreateToken(ctx, agentSA, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := withToken(tr.Status.Token)
	// The identity is the agent's pod on its node, as the policy reads it.
	review, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := review.Status.UserInfo
	if info.Username != "system:serviceaccount:"+releaseNamespace+":"+agentSA || !slices.Contains(info.Extra["authentication.kubernetes.io/node-name"], node) {
		t.Fatalf("the agent token is %s with %v, not the agent's pod on %s", info.Username, info.Extra, node)
	}
	return cfg
}
