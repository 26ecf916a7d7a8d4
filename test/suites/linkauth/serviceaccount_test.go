package linkauth_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/internal/agent/edgecert"
	"github.com/dowse-dev/dowse/internal/controller/link/linkauth"
	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// agentPod is a pod of service account sa on node, as a DaemonSet makes it
// (no kubelet runs it: the API server binds tokens to the object).
func agentPod(t *testing.T, ns, sa, node string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	if _, err := suite.Clientset.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
		if _, err := suite.Clientset.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := suite.Clientset.CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{}); err != nil {
		if _, err := suite.Clientset.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod, err := suite.Clientset.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: sa + "-"},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node,
			Containers: []corev1.Container{{Name: "agent", Image: "dowse-agent"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// saToken is what the kubelet would project into pod (nil: an unbound
// token), written to a file as the agent reads it.
func saToken(t *testing.T, ns, sa string, pod *corev1.Pod, audience string) string {
	t.Helper()
	spec := authnv1.TokenRequestSpec{Audiences: []string{audience}}
	if pod != nil {
		spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := suite.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa, &authnv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(tr.Status.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The agents of a DaemonSet join the link each as its own node, with their
// pod's service account token; every other token is refused with a reason.
func TestServiceAccountBootstrap(t *testing.T) {
	ns := suite.Namespace(t) // the agents'
	c := startCloud(t, time.Hour, func(cfg *linkauth.Config) {
		cfg.TokenReviews = suite.Clientset.AuthenticationV1().TokenReviews()
		cfg.AgentServiceAccounts = []string{ns + "/dowse-agent"}
	})
	edge := func(node, tokenFile string) *edgecert.Manager {
		cfg := c.edgeConfig(t, node, "")
		cfg.ServiceAccountTokenFile = tokenFile
		m, err := edgecert.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	podA := agentPod(t, ns, "dowse-agent", "sa-edge-a")
	podB := agentPod(t, ns, "dowse-agent", "sa-edge-b")
	for node, pod := range map[string]*corev1.Pod{"sa-edge-a": podA, "sa-edge-b": podB} {
		m := edge(node, saToken(t, ns, "dowse-agent", pod, pki.ServiceAccountAudience))
		if err := m.Bootstrap(context.Background()); err != nil {
			t.Fatalf("%s: %v", node, err)
		}
		cert, err := m.GetClientCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := pki.NodeFromCert(cert.Leaf); err != nil || got != node {
			t.Fatalf("certificate names %q (%v), want %s", cert.Leaf.Subject.CommonName, err, node)
		}
	}
	// Reusable while the pod lives: an agent restarted with empty state
	// joins again.
	if err := edge("sa-edge-a", saToken(t, ns, "dowse-agent", podA, pki.ServiceAccountAudience)).Bootstrap(context.Background()); err != nil {
		t.Fatalf("second bootstrap of sa-edge-a: %v", err)
	}
	if got := c.counter(t, "dowse_linkauth_certificates_issued_total", map[string]string{"request": "bootstrap"}); got != 3 {
		t.Errorf("issued %v certificates, want 3", got)
	}

	refusals := []struct {
		name, node, tokenFile string
		status                int
		words, reason         string
	}{
		{"pod on another node", "sa-edge-b", saToken(t, ns, "dowse-agent", podA, pki.ServiceAccountAudience),
			http.StatusForbidden, `pod on node "sa-edge-a"`, linkauth.ReasonWrongNode},
		{"another audience", "sa-edge-a", saToken(t, ns, "dowse-agent", podA, "https://kubernetes.default.svc"),
			http.StatusUnauthorized, "not valid for audience", linkauth.ReasonInvalidSAToken},
		{"not bound to a pod", "sa-edge-a", saToken(t, ns, "dowse-agent", nil, pki.ServiceAccountAudience),
			http.StatusUnauthorized, "not bound to a pod", linkauth.ReasonSATokenNotBound},
		{"another service account", "sa-edge-a", saToken(t, ns, "intruder", agentPod(t, ns, "intruder", "sa-edge-a"), pki.ServiceAccountAudience),
			http.StatusForbidden, "may not join nodes", linkauth.ReasonSANotAllowed},
		{"garbage", "sa-edge-a", func() string {
			p := filepath.Join(t.TempDir(), "token")
			_ = os.WriteFile(p, []byte("not-a-jwt"), 0o600)
			return p
		}(), http.StatusUnauthorized, "not valid", linkauth.ReasonInvalidSAToken},
	}
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			m := edge(r.node, r.tokenFile)
			expectRefused(t, m.Bootstrap(context.Background()), r.status, r.words)
			if _, err := m.GetClientCertificate(nil); err == nil {
				t.Error("the refused edge has a certificate")
			}
			c.expectRefusal(t, "bootstrap", r.reason)
		})
	}

	// The token dies with its pod (a deleted DaemonSet pod, a stolen token).
	gone := agentPod(t, ns, "dowse-agent", "sa-edge-c")
	tokenFile := saToken(t, ns, "dowse-agent", gone, pki.ServiceAccountAudience)
	if err := suite.Clientset.CoreV1().Pods(ns).Delete(context.Background(), gone.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ns, gone.Name)
	expectRefused(t, edge("sa-edge-c", tokenFile).Bootstrap(context.Background()), http.StatusUnauthorized, "not valid")
}

// A cloud not set up for service accounts says so.
func TestServiceAccountBootstrapOff(t *testing.T) {
	c := startCloud(t, time.Hour)
	pod := agentPod(t, c.ns, "dowse-agent", "sa-edge-off")
	cfg := c.edgeConfig(t, "sa-edge-off", "")
	cfg.ServiceAccountTokenFile = saToken(t, c.ns, "dowse-agent", pod, pki.ServiceAccountAudience)
	m, err := edgecert.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	expectRefused(t, m.Bootstrap(context.Background()), http.StatusForbidden, "does not take service account tokens")
	c.expectRefusal(t, "bootstrap", linkauth.ReasonSABootstrapOff)
}

func waitGone(t *testing.T, ns, pod string) {
	t.Helper()
	testwait.For(t, 30*time.Second, func() error {
		if _, err := suite.Clientset.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{}); err == nil {
			return fmt.Errorf("pod %s still there", pod)
		}
		return nil
	})
}

// A node whose certificate expired before it could renew (offline, or
// renewals refused) bootstraps again with its pod's token, by itself.
func TestServiceAccountEdgeBootstrapsAgainAfterExpiry(t *testing.T) {
	ns := suite.Namespace(t)
	c := startCloud(t, 3*time.Second, func(cfg *linkauth.Config) {
		cfg.TokenReviews = suite.Clientset.AuthenticationV1().TokenReviews()
		cfg.AgentServiceAccounts = []string{ns + "/dowse-agent"}
		cfg.NodeUID = func(context.Context, string) (string, bool, error) { return "", false, nil } // every renewal refused
	})
	cfg := c.edgeConfig(t, "sa-edge-expiry", "")
	cfg.ServiceAccountTokenFile = saToken(t, ns, "dowse-agent", agentPod(t, ns, "dowse-agent", "sa-edge-expiry"), pki.ServiceAccountAudience)
	m, err := edgecert.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Bootstrap(context.Background()); err != nil {
		t.Fatal(err)
	}
	first, _ := m.GetClientCertificate(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	defer func() { cancel(); <-done }()
	testwait.For(t, 30*time.Second, func() error {
		cur, _ := m.GetClientCertificate(nil)
		if cur.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) != 0 && time.Now().Before(cur.Leaf.NotAfter) {
			return nil
		}
		return fmt.Errorf("still on the expired certificate (not after %s)", first.Leaf.NotAfter)
	})
	c.expectRefusal(t, "renew", linkauth.ReasonNodeNotAllowed)
	if got := c.counter(t, "dowse_linkauth_certificates_issued_total", map[string]string{"request": "bootstrap"}); got != 2 {
		t.Fatalf("%v bootstraps, want 2 (the first and the one after expiry)", got)
	}
}
