package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The agents' identity as deploy/agent/agent.yaml gives it.
const (
	AgentNamespace      = "dowse-system"
	AgentServiceAccount = "dowse-agent"
)

// AgentManifest is the agent's part of deploy/ (rendered from the chart).
func AgentManifest() string { return filepath.Join(RepoRoot(), "deploy", "agent", "agent.yaml") }

// agentAccessKinds are the objects of AgentManifest that say what an agent
// may do: everything in it but the DaemonSet.
var agentAccessKinds = []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
	"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}

// InstallAgentAccess creates the agents' namespace, service account, RBAC
// and admission policy from deploy/agent/agent.yaml, as an install would,
// and waits until the policy is enforced.
func InstallAgentAccess(ctx context.Context, admin *rest.Config) error {
	c, err := client.New(admin, client.Options{})
	if err != nil {
		return err
	}
	objs, err := ReadManifest(AgentManifest())
	if err != nil {
		return err
	}
	for _, o := range objs {
		if !slices.Contains(agentAccessKinds, o.GetKind()) {
			continue
		}
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	// The admission plugin sees a new policy a moment after it is created;
	// until then an agent's writes would pass unchecked. Wait until it
	// refuses one it must refuse: a dry-run create by an agent token that
	// names no node.
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	tr, err := cs.CoreV1().ServiceAccounts(AgentNamespace).CreateToken(ctx, AgentServiceAccount, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("minting a probe token: %w", err)
	}
	probe, err := client.New(WithToken(admin, tr.Status.Token), client.Options{})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("dowse.dev/v1alpha1")
		u.SetKind("Instance")
		u.SetNamespace(AgentNamespace)
		u.SetName("policy-probe")
		u.Object["spec"] = map[string]any{"configurationName": "probe", "deviceID": "probe", "shared": true}
		err := probe.Create(ctx, u, client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), "node-identity") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent admission policy is not enforced 30s after it was created (a probe write answered %w)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ReadManifest reads every object of a multi-document YAML file.
func ReadManifest(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// AgentPod creates the pod of the agent DaemonSet on node (and the Node
// when it does not exist, Ready), as the DaemonSet controller and the
// scheduler would. The API server binds tokens to it.
func AgentPod(ctx context.Context, cs kubernetes.Interface, serviceAccount, node string) (*corev1.Pod, error) {
	if _, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
		if err == nil {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
			if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
				return nil, err
			}
		}
	} else if err != nil {
		return nil, err
	}
	return cs.CoreV1().Pods(AgentNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: serviceAccount + "-", Labels: map[string]string{"app.kubernetes.io/name": "dowse-agent"}},
		Spec: corev1.PodSpec{ServiceAccountName: serviceAccount, NodeName: node,
			// On a node with a kubelet the container never starts: the
			// pod is there for its token.
			Containers: []corev1.Container{{Name: "agent", Image: "dowse-agent", ImagePullPolicy: corev1.PullNever}}},
	}, metav1.CreateOptions{})
}

// PodToken is the token the kubelet would project into pod: bound to it,
// so that it carries the authentication.kubernetes.io/node-name claim, for
// the API server's own audience.
func PodToken(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) (string, error) {
	tr, err := cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		ExpirationSeconds: ptr.To(int64(6 * 3600)),
	}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("minting a token for pod %s: %w", pod.Name, err)
	}
	return tr.Status.Token, nil
}

// AgentConfig is a rest.Config for an agent on node, authenticated as the
// agent DaemonSet's pod there would be: admin's server and CA, the pod's
// token instead of admin's client certificate.
func AgentConfig(ctx context.Context, admin *rest.Config, node string) (*rest.Config, error) {
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	pod, err := AgentPod(ctx, cs, AgentServiceAccount, node)
	if err != nil {
		return nil, err
	}
	token, err := PodToken(ctx, cs, pod)
	if err != nil {
		return nil, err
	}
	return WithToken(admin, token), nil
}

// WithToken is admin's server and CA with token as the only credential.
func WithToken(admin *rest.Config, token string) *rest.Config {
	cfg := rest.AnonymousClientConfig(admin)
	cfg.BearerToken = token
	return cfg
}
