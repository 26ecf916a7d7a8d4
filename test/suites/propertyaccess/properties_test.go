package propertyaccess_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/controller"
	"github.com/dowse-dev/dowse/internal/controller/propertyaccess"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/handler"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

const handlerName = "props-echo"

// startController runs the real controller in-process under the chart's
// controller service account.
func startController(t *testing.T, agentAccounts []string) {
	t.Helper()
	startControllerAs(t, controllerConfig(t, controllerSA), agentAccounts, nil)
}

// startControllerAs runs the controller with restCfg's credentials,
// serving Configurations of served (nil: any namespace).
func startControllerAs(t *testing.T, restCfg *rest.Config, agentAccounts, served []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- controller.Run(ctx, controller.Config{
			RESTConfig: restCfg, NodeGracePeriod: time.Hour, Namespace: releaseNamespace,
			AgentServiceAccounts: agentAccounts, ConfigurationNamespaces: served, Serving: kubeflags.Off(),
			Registerer: prometheus.NewRegistry(), SkipNameValidation: true,
		}, testr.New(t).WithName("controller"))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("controller: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the controller did not stop")
		}
	})
}

// secretRequests records the agent's requests for Secrets and ConfigMaps.
type secretRequests struct {
	mu   sync.Mutex
	urls []string
}

func (s *secretRequests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if p := r.URL.Path; strings.Contains(p, "/secrets") || strings.Contains(p, "/configmaps") {
			s.mu.Lock()
			s.urls = append(s.urls, r.Method+" "+r.URL.RequestURI())
			s.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

func (s *secretRequests) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.urls...)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// startAgent runs the real agent in-process with restCfg (an agent pod's
// token), and a handler beside it that reports the properties it is given.
func startAgent(t *testing.T, node string, restCfg *rest.Config) (*propsHandler, *secretRequests) {
	t.Helper()
	dir, err := os.MkdirTemp("", "dowse-pa-") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	reqs := &secretRequests{}
	restCfg = rest.CopyConfig(restCfg)
	restCfg.WrapTransport = reqs.wrap
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, agent.Config{
			RESTConfig: restCfg, NodeName: node, StateDir: dir, SkipNameValidation: true,
			GracePeriod: time.Minute, WriteConcurrency: 4, Client: kubeflags.Client{QPS: 100, Burst: 200},
			Serving: kubeflags.Off(), Registerer: prometheus.NewRegistry(),
		}, testr.New(t).WithName(node))
	}()
	h := &propsHandler{}
	srv, err := handler.NewServer(handler.Config{Name: handlerName, Shared: true, StateDir: dir, Discoverer: h, Logger: testr.New(t).WithName("handler")})
	if err != nil {
		t.Fatal(err)
	}
	hdone := make(chan error, 1)
	go func() { hdone <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		for _, c := range []chan error{hdone, done} {
			select {
			case err := <-c:
				if err != nil {
					t.Errorf("agent or handler: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("the agent did not stop")
			}
		}
	})
	return h, reqs
}

// propsHandler is a discovery handler that keeps the properties of its
// newest Discover stream and reports one device carrying the PASSWORD it
// was given, as a broker property.
type propsHandler struct {
	mu   sync.Mutex
	last map[string]string
}

func (h *propsHandler) Discover(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
	props := map[string]string{}
	for k, v := range req.GetDiscoveryProperties() {
		props[k] = string(v.GetVec())
	}
	h.mu.Lock()
	h.last = props
	h.mu.Unlock()
	if err := send([]*discoveryv1.Device{{Id: "cam-1", Properties: map[string]string{"SEEN_PASSWORD": props["PASSWORD"]}}}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

func (h *propsHandler) properties() map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

func (h *propsHandler) expect(t *testing.T, timeout time.Duration, want map[string]string) {
	t.Helper()
	testwait.For(t, timeout, func() error {
		if got := h.properties(); !reflect.DeepEqual(got, want) {
			return fmt.Errorf("the handler has %v, want %v", got, want)
		}
		return nil
	})
}

func secretRef(name, key string) *v1alpha1.DiscoveryPropertySource {
	return &v1alpha1.DiscoveryPropertySource{SecretKeyRef: &v1alpha1.ObjectKeyRef{Name: name, Key: key}}
}

func configMapRef(name, key string) *v1alpha1.DiscoveryPropertySource {
	return &v1alpha1.DiscoveryPropertySource{ConfigMapKeyRef: &v1alpha1.ObjectKeyRef{Name: name, Key: key}}
}

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := suite.Client.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
}

// createConfiguration creates a Configuration of the test handler, deleted
// when the test ends (while its agent still runs, to take its finalizer
// off; after 10 s the finalizers are removed by hand).
func createConfiguration(t *testing.T, ns, name string, props ...v1alpha1.DiscoveryProperty) *v1alpha1.Configuration {
	t.Helper()
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{Name: handlerName, DiscoveryProperties: props}}}
	create(t, cfg)
	t.Cleanup(func() {
		ctx := context.Background()
		if err := suite.Client.Delete(ctx, cfg); client.IgnoreNotFound(err) != nil {
			t.Error(err)
			return
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			var cur v1alpha1.Configuration
			err := suite.Client.Get(ctx, client.ObjectKeyFromObject(cfg), &cur)
			if apierrors.IsNotFound(err) {
				return
			}
			if err == nil && time.Now().After(deadline) {
				cur.Finalizers = nil
				_ = suite.Client.Update(ctx, &cur)
			}
			if time.Now().After(deadline.Add(10 * time.Second)) {
				t.Errorf("Configuration %s/%s still there", ns, name)
				return
			}
		}
	})
	return cfg
}

// role returns the namespace's property access Role, nil when there is none.
func role(t *testing.T, ns string) *rbacv1.Role {
	t.Helper()
	r, err := suite.Clientset.RbacV1().Roles(ns).Get(t.Context(), v1alpha1.PropertyAccessRole, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func expectRules(t *testing.T, ns string, secrets, configMaps []string) {
	t.Helper()
	want := propertyaccess.Rules(secrets, configMaps)
	testwait.For(t, 10*time.Second, func() error {
		r := role(t, ns)
		if len(want) == 0 {
			if r != nil {
				return fmt.Errorf("Role %s/%s is still there: %v", ns, v1alpha1.PropertyAccessRole, r.Rules)
			}
			if _, err := suite.Clientset.RbacV1().RoleBindings(ns).Get(t.Context(), v1alpha1.PropertyAccessRole, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("RoleBinding %s/%s is still there (%w)", ns, v1alpha1.PropertyAccessRole, err)
			}
			return nil
		}
		if r == nil {
			return fmt.Errorf("no Role %s/%s", ns, v1alpha1.PropertyAccessRole)
		}
		if !reflect.DeepEqual(r.Rules, want) {
			return fmt.Errorf("Role %s/%s rules %v, want %v", ns, v1alpha1.PropertyAccessRole, r.Rules, want)
		}
		return nil
	})
}

func byName(name string) metav1.ListOptions {
	return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
}

// expectWatchAdded opens w and waits for the object's ADDED event.
func expectWatchAdded(t *testing.T, w watch.Interface, err error, name string) {
	t.Helper()
	if err != nil {
		t.Fatalf("watching %s: %v", name, err)
	}
	defer w.Stop()
	select {
	case ev := <-w.ResultChan():
		o, ok := ev.Object.(metav1.Object)
		if ev.Type != watch.Added || !ok || o.GetName() != name {
			t.Fatalf("watch of %s: first event %s %v", name, ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("watch of %s: no event", name)
	}
}

func expectForbidden(t *testing.T, what string, err error) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: %v, want Forbidden", what, err)
	}
}

// The agent identity reads and watches the objects a Configuration names,
// by name, and nothing else; the whole path takes a Secret's value to the
// handler and follows its change; a reference removed is a grant removed.
func TestAgentReadsOnlyWhatConfigurationsName(t *testing.T) {
	accounts := installRBAC(t)
	ns := suite.Namespace(t)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "camera-cred"}, Data: map[string][]byte{"password": []byte("one")}}
	create(t,
		sec,
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plant-opc"}, Data: map[string]string{"url": "opc.tcp://plant:4840"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "payroll"}, Data: map[string][]byte{"k": []byte("not yours")}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unrelated"}, Data: map[string]string{"k": "v"}},
	)
	startController(t, accounts)
	agentCfg := agentConfig(t, "node-a")
	h, reqs := startAgent(t, "node-a", agentCfg)
	cfg := createConfiguration(t, ns, "cams",
		v1alpha1.DiscoveryProperty{Name: "PASSWORD", ValueFrom: secretRef("camera-cred", "password")},
		v1alpha1.DiscoveryProperty{Name: "URL", ValueFrom: configMapRef("plant-opc", "url")},
	)
	expectRules(t, ns, []string{"camera-cred"}, []string{"plant-opc"})
	testwait.For(t, 10*time.Second, func() error {
		rb, err := suite.Clientset.RbacV1().RoleBindings(ns).Get(t.Context(), v1alpha1.PropertyAccessRole, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if want := []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: releaseNamespace, Name: agentSA}}; !reflect.DeepEqual(rb.Subjects, want) {
			return fmt.Errorf("binding subjects %v, want %v", rb.Subjects, want)
		}
		return nil
	})

	as := kubernetes.NewForConfigOrDie(agentCfg)
	ctx := t.Context()
	t.Run("named objects are readable by name", func(t *testing.T) {
		if _, err := as.CoreV1().Secrets(ns).Get(ctx, "camera-cred", metav1.GetOptions{}); err != nil {
			t.Errorf("get of the named Secret: %v", err)
		}
		if _, err := as.CoreV1().ConfigMaps(ns).Get(ctx, "plant-opc", metav1.GetOptions{}); err != nil {
			t.Errorf("get of the named ConfigMap: %v", err)
		}
		if l, err := as.CoreV1().Secrets(ns).List(ctx, byName("camera-cred")); err != nil || len(l.Items) != 1 {
			t.Errorf("list of the named Secret by name: %v", err)
		}
		w, err := as.CoreV1().Secrets(ns).Watch(ctx, byName("camera-cred"))
		expectWatchAdded(t, w, err, "camera-cred")
		w, err = as.CoreV1().ConfigMaps(ns).Watch(ctx, byName("plant-opc"))
		expectWatchAdded(t, w, err, "plant-opc")
	})
	t.Run("everything else is refused", func(t *testing.T) {
		_, err := as.CoreV1().Secrets(ns).Get(ctx, "payroll", metav1.GetOptions{})
		expectForbidden(t, "get of an unreferenced Secret", err)
		_, err = as.CoreV1().ConfigMaps(ns).Get(ctx, "unrelated", metav1.GetOptions{})
		expectForbidden(t, "get of an unreferenced ConfigMap", err)
		_, err = as.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		expectForbidden(t, "namespace-wide list of Secrets", err)
		_, err = as.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
		expectForbidden(t, "cluster-wide list of Secrets", err)
		_, err = as.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
		expectForbidden(t, "cluster-wide list of ConfigMaps", err)
		_, err = as.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{})
		expectForbidden(t, "namespace-wide watch of Secrets", err)
		_, err = as.CoreV1().Secrets(ns).List(ctx, byName("payroll"))
		expectForbidden(t, "list of an unreferenced Secret by name", err)
		_, err = as.CoreV1().Secrets(releaseNamespace).List(ctx, metav1.ListOptions{})
		expectForbidden(t, "list of Secrets in the release namespace", err)
		// Nor may the agent grant itself more.
		_, err = as.RbacV1().Roles(ns).Update(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.PropertyAccessRole}}, metav1.UpdateOptions{})
		expectForbidden(t, "update of the property access Role", err)
	})

	// The whole path: the handler is given the Secret's value, and its new
	// value after a change.
	h.expect(t, 30*time.Second, map[string]string{"PASSWORD": "one", "URL": "opc.tcp://plant:4840"})
	expectBrokerProperty(t, ns, "cams", "one")
	sec.Data["password"] = []byte("two")
	if err := suite.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	h.expect(t, 30*time.Second, map[string]string{"PASSWORD": "two", "URL": "opc.tcp://plant:4840"})
	expectBrokerProperty(t, ns, "cams", "two")

	// A reference removed takes its name out of the Role; the agent stops
	// watching it and may no longer read it.
	// The controller writes the Configuration's status meanwhile: retry on
	// a conflict.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur v1alpha1.Configuration
		if err := suite.Client.Get(ctx, client.ObjectKeyFromObject(cfg), &cur); err != nil {
			return err
		}
		cur.Spec.DiscoveryHandler.DiscoveryProperties = cur.Spec.DiscoveryHandler.DiscoveryProperties[1:]
		return suite.Client.Update(ctx, &cur)
	}); err != nil {
		t.Fatal(err)
	}
	expectRules(t, ns, nil, []string{"plant-opc"})
	h.expect(t, 30*time.Second, map[string]string{"URL": "opc.tcp://plant:4840"})
	testwait.For(t, 10*time.Second, func() error {
		_, err := as.CoreV1().Secrets(ns).Get(ctx, "camera-cred", metav1.GetOptions{})
		if !apierrors.IsForbidden(err) {
			return fmt.Errorf("get of the Secret no longer named: %w, want Forbidden", err)
		}
		return nil
	})

	// Every read of a Secret or ConfigMap the agent made named its object.
	urls := reqs.all()
	for _, u := range urls {
		if !strings.Contains(u, "fieldSelector=metadata.name%3D") {
			t.Errorf("the agent asked for Secrets or ConfigMaps without naming one: %s", u)
		}
	}
	t.Logf("the agent made %d requests for Secrets and ConfigMaps, each by name: %v", len(urls), urls)

	// The last reference gone, Role and RoleBinding go.
	if err := suite.Client.Delete(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	expectRules(t, ns, nil, nil)
}

// expectBrokerProperty waits for the Configuration's Instance to carry the
// value the handler was given (it reports it as SEEN_PASSWORD).
func expectBrokerProperty(t *testing.T, ns, cfg, want string) {
	t.Helper()
	testwait.For(t, 30*time.Second, func() error {
		var list v1alpha1.InstanceList
		if err := suite.Client.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, i := range list.Items {
			if i.Spec.ConfigurationName == cfg && i.Spec.BrokerProperties["SEEN_PASSWORD"] == want {
				return nil
			}
		}
		return fmt.Errorf("no Instance of %s with SEEN_PASSWORD=%s", cfg, want)
	})
}

// An agent whose Configuration names a Secret the controller has not
// granted yet says so in the Configuration's status, and gets the value by
// itself once the controller grants it.
func TestForbiddenUntilGranted(t *testing.T) {
	accounts := installRBAC(t)
	ns := suite.Namespace(t)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "late-cred"}, Data: map[string][]byte{"password": []byte("finally")}})
	h, _ := startAgent(t, "node-b", agentConfig(t, "node-b"))
	createConfiguration(t, ns, "late", v1alpha1.DiscoveryProperty{Name: "PASSWORD", ValueFrom: secretRef("late-cred", "password")})
	testwait.For(t, 30*time.Second, func() error {
		var cfg v1alpha1.Configuration
		if err := suite.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "late"}, &cfg); err != nil {
			return err
		}
		for _, n := range cfg.Status.Nodes {
			if n.NodeName != "node-b" {
				continue
			}
			c := meta.FindStatusCondition(n.Conditions, v1alpha1.ConditionDiscovering)
			if c != nil && c.Status == metav1.ConditionFalse && c.Reason == "PropertiesUnresolved" &&
				strings.Contains(c.Message, "forbidden") && strings.Contains(c.Message, "Role "+v1alpha1.PropertyAccessRole+" of namespace "+ns) {
				t.Logf("node-b's condition: %s", c.Message)
				return nil
			}
			return fmt.Errorf("node-b's condition %+v", c)
		}
		return fmt.Errorf("no status of node-b: %+v", cfg.Status)
	})
	if p := h.properties(); p != nil {
		t.Fatalf("the handler was given %v before the Secret could be read", p)
	}
	startController(t, accounts)
	expectRules(t, ns, []string{"late-cred"}, nil)
	// The agent's watch retries with backoff (0.8 s doubling to 30 s).
	h.expect(t, 60*time.Second, map[string]string{"PASSWORD": "finally"})
}
