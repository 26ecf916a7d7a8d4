// Package helm tests the Helm chart deploy/helm/dowse with the Helm built
// from the module proxy (bin/helm, `make helm`): it lints, renders with the
// default values and with every part on (ci/all-on-values.yaml), and applies
// what it renders to a real API server with a server-side dry run, so that
// every object the chart makes is one the API server accepts.
package helm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/promtest"
)

var (
	restConfig *rest.Config
	startErr   error
)

func TestMain(m *testing.M) {
	// The API server is started only when Helm is there: without it every
	// test skips (or fails under CI) before needing one.
	if _, err := os.Stat(helmPath()); err == nil {
		cp, err := kube.Start()
		if err != nil {
			startErr = err
		} else {
			restConfig = cp.Config
			code := m.Run()
			_ = cp.Stop()
			os.Exit(code)
		}
	}
	os.Exit(m.Run())
}

func chartDir() string { return filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse") }
func helmPath() string { return filepath.Join(kube.RepoRoot(), "bin", "helm") }

// helm runs bin/helm. Missing, the test is skipped, or fails under CI
// (CI=true): CI must build it.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	cmd := kube.HelmCommand(t.Context(), t, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s\n%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

func allOnValues() string { return filepath.Join(chartDir(), "ci", "all-on-values.yaml") }

func TestHelmVersion(t *testing.T) {
	v := strings.TrimSpace(helm(t, "version", "--template", "{{.Version}}"))
	if v != "v3.22.0" {
		t.Fatalf("bin/helm is %q, want v3.22.0 (hack/helm/go.mod): run `make helm`", v)
	}
}

func TestLint(t *testing.T) {
	for _, args := range [][]string{nil, {"--values", allOnValues()}} {
		out := helm(t, append([]string{"lint", "--strict", chartDir()}, args...)...)
		if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") || strings.Contains(out, "[WARNING]") {
			t.Errorf("helm lint %v:\n%s", args, out)
		}
	}
}

// TestChartCRDsAreGenerated: the chart's crds/ is a copy of deploy/crds
// (controller-gen's output), made by `make generate`.
func TestChartCRDsAreGenerated(t *testing.T) {
	gen, _ := filepath.Glob(filepath.Join(kube.CRDDir(), "*.yaml"))
	inChart, _ := filepath.Glob(filepath.Join(chartDir(), "crds", "*.yaml"))
	if len(gen) == 0 || len(gen) != len(inChart) {
		t.Fatalf("deploy/crds has %d CRDs, the chart's crds/ %d: run `make generate`", len(gen), len(inChart))
	}
	for _, f := range gen {
		a, _ := os.ReadFile(f)
		b, err := os.ReadFile(filepath.Join(chartDir(), "crds", filepath.Base(f)))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("chart's crds/%s differs from deploy/crds (%v): run `make generate`", filepath.Base(f), err)
		}
	}
}

// render runs helm template into namespace ns and decodes every object.
func render(t *testing.T, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out := helm(t, append([]string{"template", "dowse", chartDir(), "--namespace", ns}, args...)...)
	r := utilyaml.NewYAMLReader(bufioReader(out))
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
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// dryRun creates namespace ns for real and every object with a server-side
// dry run: the API server runs defaulting, validation (CRD schemas
// included) and admission, and stores nothing.
func dryRun(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	t.Helper()
	if startErr != nil {
		t.Fatal(startErr)
	}
	cl, err := client.New(restConfig, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, o := range objs {
		if err := cl.Create(t.Context(), o.DeepCopy(), client.DryRunAll); err != nil {
			t.Errorf("%s %s/%s refused: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}

func index(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	m := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		m[o.GetKind()+"/"+o.GetName()] = o
	}
	return m
}

func TestDefaultValues(t *testing.T) {
	const ns = "dowse-defaults"
	objs := render(t, ns)
	dryRun(t, ns, objs)
	got := index(objs)
	for _, want := range []string{
		"ServiceAccount/dowse-agent", "ClusterRole/dowse-agent", "ClusterRoleBinding/dowse-agent", "DaemonSet/dowse-agent",
		"ServiceAccount/dowse-controller", "ClusterRole/dowse-controller", "Role/dowse-controller-leader-election",
		"Deployment/dowse-controller", "PodDisruptionBudget/dowse-controller",
		// The hooks: CRDs applied before install and upgrade, everything
		// taken away before uninstall.
		"ServiceAccount/dowse-hooks", "ClusterRole/dowse-hooks", "ClusterRoleBinding/dowse-hooks", "Role/dowse-hooks", "RoleBinding/dowse-hooks", "Job/dowse-apply-crds", "Job/dowse-uninstall", "Job/dowse-after-uninstall",
	} {
		if got[want] == nil {
			t.Errorf("default values render no %s", want)
		}
	}
	// Deleting Leases (other components' leader elections, nodes'
	// heartbeats) is granted in the release's namespace only.
	for k, o := range got {
		if !strings.HasPrefix(k, "ClusterRole/") {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
			verbs, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "verbs")
			if slices.Contains(res, "leases") && (slices.Contains(verbs, "delete") || slices.Contains(verbs, "deletecollection")) {
				t.Errorf("%s may delete Leases in every namespace: %v", k, r)
			}
		}
	}
	if r := got["Role/dowse-hooks"]; r == nil || r.GetNamespace() != ns {
		t.Errorf("Role/dowse-hooks %v, want one in %s (the link's Leases)", r, ns)
	}
	for k := range got {
		for _, absent := range []string{"Namespace/", "Configuration/", "PodMonitor/", "Service/", "Secret/", "DaemonSet/dowse-onvif", "DaemonSet/dowse-modbus-mapper",
			// debug-echo's pretend devices only when asked, as Akri's chart.
			"DaemonSet/dowse-debug-echo", "PrometheusRule/", "ConfigMap/dowse-dashboard"} {
			if strings.HasPrefix(k, absent) {
				t.Errorf("default values render %s", k)
			}
		}
	}
	if d := got["Deployment/dowse-controller"]; d != nil {
		if r, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas"); r != 2 {
			t.Errorf("controller replicas %d, want 2", r)
		}
		args := containerArgs(t, d, "controller")
		if !slices.Contains(args, "--leader-elect=true") || !slices.Contains(args, "--leader-election-namespace="+ns) {
			t.Errorf("controller args %v lack leader election in %s", args, ns)
		}
	}
	checkPods(t, objs)
}

func TestAllOn(t *testing.T) {
	const ns = "dowse-all-on"
	objs := render(t, ns, "--values", allOnValues(), "--api-versions", "monitoring.coreos.com/v1", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule")
	installPodMonitorCRD(t)
	dryRun(t, ns, objs)
	got := index(objs)
	var want []string
	for _, p := range []string{"debug-echo", "onvif", "udev", "opcua", "modbus", "modbus-rtu", "mdns", "mqtt", "snmp"} {
		want = append(want, "DaemonSet/dowse-"+p+"-discovery", "PodMonitor/dowse-"+p+"-discovery")
	}
	for _, p := range []string{"onvif", "opcua", "modbus", "snmp", "mqtt"} {
		want = append(want, "DaemonSet/dowse-"+p+"-mapper", "PodMonitor/dowse-"+p+"-mapper")
	}
	want = append(want, "Configuration/debug-echo", "Configuration/onvif-camera", "Configuration/udev", "Configuration/opcua-server",
		"Configuration/modbus-plc", "Configuration/snmp-agent", "Service/dowse-cloudhub",
		"PodMonitor/dowse-agent", "PodMonitor/dowse-controller", "PodMonitor/dowse-controller-mappers", "PrometheusRule/dowse", "ConfigMap/dowse-dashboard",
		"DaemonSet/dowse-zeroconf-discovery", "Configuration/printers")
	for _, w := range want {
		if got[w] == nil {
			t.Errorf("all-on values render no %s", w)
		}
	}
	for _, ds := range []string{"dowse-agent", "dowse-udev-discovery", "dowse-modbus-mapper"} {
		if o := got["DaemonSet/"+ds]; o != nil {
			sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "spec", "nodeSelector")
			tol, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "tolerations")
			img := containerImage(t, o)
			if sel["kubernetes.io/os"] != "linux" || len(tol) != 1 || !strings.HasSuffix(img, ":v0.1.0-test") {
				t.Errorf("%s: nodeSelector %v, tolerations %v, image %s: not the values'", ds, sel, tol, img)
			}
		}
	}
	checkPods(t, objs)
	checkLink(t, got)
	if c := got["Configuration/printers"]; c != nil {
		if a, _, _ := unstructured.NestedString(c.Object, "spec", "allocation"); a != "DRA" {
			t.Errorf("the values' Configuration has allocation %q, want DRA", a)
		}
	}
	if ds := got["DaemonSet/dowse-zeroconf-discovery"]; ds != nil {
		c := containers(t, ds)[0]
		if c.Image != "example.org/akri/zeroconf-discovery:v1" || !slices.Contains(c.Args, "--verbose") || !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "DISCOVERY_HANDLERS_DIRECTORY" }) {
			t.Errorf("custom handler container %+v", c)
		}
	}
}

// TestSchema: values of the wrong type or outside their enum fail helm lint
// and helm install (template), naming the value.
func TestSchema(t *testing.T) {
	for set, want := range map[string]string{
		"controller.replicas=two":                   "/controller/replicas",
		"agent.enabled=yes":                         "/agent/enabled",
		"modbus.configuration.allocation=Sometimes": "/modbus/configuration/allocation",
		"image.pullPolicy=Sometimes":                "/image/pullPolicy",
		"controller.nodeGracePeriod=soon":           "/controller/nodeGracePeriod",
		"agnet.enabled=true":                        "agnet",
	} {
		for _, cmd := range []string{"lint", "template"} {
			out, err := kube.HelmCommand(context.Background(), t, cmd, chartDir(), "--set", set).CombinedOutput()
			if err == nil || !strings.Contains(string(out), want) {
				t.Errorf("helm %s --set %s: %v, want a failure naming %s:\n%s", cmd, set, err, want, out)
			}
		}
	}
}

// TestRulesAndDashboard: promtool (Debian's prometheus) passes the chart's
// alerting rules, as they are and as the PrometheusRule renders them; the
// dashboard is JSON whose every panel queries Dowse metrics. (That each
// queried metric is served is checked against a scrape of the agent and
// controller on the real node, test/suites/node.)
func TestRulesAndDashboard(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs promtool: hack/install-deps.sh (apt-get install prometheus) (CI=true: a missing prerequisite fails)")
		}
		t.Skip("needs promtool: hack/install-deps.sh (apt-get install prometheus)")
	}
	rules := filepath.Join(chartDir(), "files", "rules.yaml")
	objs := render(t, "dowse-rules", "--set", "prometheusRule.enabled=true", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule", "--show-only", "templates/monitoring.yaml")
	if len(objs) != 1 || objs[0].GetKind() != "PrometheusRule" {
		t.Fatalf("rendered %v, want one PrometheusRule", objs)
	}
	spec, _, _ := unstructured.NestedMap(objs[0].Object, "spec")
	rendered, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	renderedFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(renderedFile, rendered, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{rules, renderedFile} {
		out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool check rules %s: %v\n%s", f, err, out)
		}
	}
	metrics := promtest.QueriedMetrics(t, filepath.Join(chartDir(), "files", "dashboard.json"), rules)
	if len(metrics) < 8 {
		t.Errorf("the dashboard and rules query only %v", metrics)
	}
	t.Logf("queried: %v", metrics)
}

// checkLink: with the controller's CA, the chart renders no CA key (it
// would be in Helm's release history); agents pin the CA certificate from
// the ConfigMap the controller publishes and join with their service
// account token; the controller serves the hosts of the values.
func checkLink(t *testing.T, got map[string]*unstructured.Unstructured) {
	t.Helper()
	for _, k := range []string{"Secret/dowse-link-ca", "ConfigMap/dowse-link-ca-cert"} {
		if got[k] != nil {
			t.Errorf("the chart renders %s: the controller makes the CA and publishes its certificate", k)
		}
	}
	var ps corev1.PodSpec
	spec, _, _ := unstructured.NestedMap(got["DaemonSet/dowse-agent"].Object, "spec", "template", "spec")
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &ps); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ps.Volumes, func(v corev1.Volume) bool {
		return v.ConfigMap != nil && v.ConfigMap.Name == "dowse-link-ca-cert"
	}) {
		t.Errorf("the agent mounts no dowse-link-ca-cert ConfigMap: volumes %v", ps.Volumes)
	}
	agentArgs := containerArgs(t, got["DaemonSet/dowse-agent"], "agent")
	for _, w := range []string{"--link-server=dowse-cloudhub.example.com:7443", "--link-auth-url=https://dowse-cloudhub.example.com:9747",
		"--link-ca-file=/etc/dowse/link-ca/ca.crt", "--link-service-account-token-file=/var/run/secrets/dowse.dev/link/token"} {
		if !slices.Contains(agentArgs, w) {
			t.Errorf("agent args %v lack %s", agentArgs, w)
		}
	}
	ctrlArgs := containerArgs(t, got["Deployment/dowse-controller"], "controller")
	if !slices.Contains(ctrlArgs, "--link-hosts=dowse-cloudhub.example.com,192.0.2.10") {
		t.Errorf("controller args %v lack the link hosts", ctrlArgs)
	}
	// The API server's egress: the Service, the serving certificate's
	// names, and each replica's address for the others' forwards.
	for _, w := range []string{"--egress-address=:8132", "--egress-peer-address=:7445", "--egress-peer-advertise=$(POD_IP):7445",
		"--egress-hosts=dowse-egress.dowse-all-on.svc,dowse-egress.dowse-all-on.svc.cluster.local,10.0.0.132,198.51.100.7"} {
		if !slices.Contains(ctrlArgs, w) {
			t.Errorf("controller args %v lack %s", ctrlArgs, w)
		}
	}
	if got["Service/dowse-egress"] == nil {
		t.Error("no Service/dowse-egress with link.egress.enabled")
	}
}

// checkPods: every container of the chart runs without privilege
// escalation, with no capabilities (the agent: CHOWN and FSETID alone) and
// a read-only root filesystem; the
// controller (which needs no host folder) as a non-root user.
func checkPods(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	n := 0
	uids := map[int64]string{}
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" && o.GetKind() != "Deployment" {
			continue
		}
		spec, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
		var ps corev1.PodSpec
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &ps); err != nil {
			t.Fatal(err)
		}
		for _, c := range ps.Containers {
			n++
			sc := c.SecurityContext
			if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || sc.Privileged != nil && *sc.Privileged {
				t.Errorf("%s %s container %s: securityContext %+v", o.GetKind(), o.GetName(), c.Name, sc)
			} else if add := slices.Sorted(slices.Values(sc.Capabilities.Add)); len(add) > 0 &&
				(o.GetName() != "dowse-agent" || !slices.Equal(add, []corev1.Capability{"CHOWN", "FSETID"})) {
				// The agent gives its socket folders to the socket group.
				t.Errorf("%s %s container %s adds capabilities %v", o.GetKind(), o.GetName(), c.Name, add)
			}
			if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("%s %s container %s has no memory request or limit", o.GetKind(), o.GetName(), c.Name)
			}
		}
		if o.GetName() == "dowse-controller" {
			if psc := ps.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
				t.Errorf("controller pod runs as root: %+v", psc)
			}
		}
		// Handlers and mappers: non-root users of their own, each in the
		// socket group, mounting of the node its socket folder alone (and,
		// for udev, udev's database read-only): never the agent's state
		// directory, where the node's link key is.
		comp := o.GetLabels()["app.kubernetes.io/component"]
		if comp == "discovery-handler" || comp == "mapper" {
			psc := ps.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 || !slices.Contains(psc.SupplementalGroups, 2000) {
				t.Errorf("%s pod security context %+v: want non-root, its own user, the socket group", o.GetName(), psc)
			} else if other, ok := uids[*psc.RunAsUser]; ok {
				t.Errorf("%s and %s run as the same user %d", o.GetName(), other, *psc.RunAsUser)
			} else {
				uids[*psc.RunAsUser] = o.GetName()
			}
			want := "/var/lib/dowse/discovery"
			if comp == "mapper" {
				want = "/var/lib/dowse/dmi"
			}
			for _, v := range ps.Volumes {
				if v.HostPath != nil && v.HostPath.Path != want && v.HostPath.Path != "/run/udev" {
					t.Errorf("%s mounts host path %s; want %s alone", o.GetName(), v.HostPath.Path, want)
				}
			}
		}
	}
	if n == 0 {
		t.Error("no container rendered")
	}
}

func containers(t *testing.T, o *unstructured.Unstructured) []corev1.Container {
	t.Helper()
	if o == nil {
		t.Fatal("no such object")
	}
	spec, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
	var ps corev1.PodSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &ps); err != nil {
		t.Fatal(err)
	}
	return ps.Containers
}

func containerArgs(t *testing.T, o *unstructured.Unstructured, name string) []string {
	t.Helper()
	for _, c := range containers(t, o) {
		if c.Name == name {
			return c.Args
		}
	}
	t.Fatalf("%s has no container %s", o.GetName(), name)
	return nil
}

func containerImage(t *testing.T, o *unstructured.Unstructured) string {
	t.Helper()
	return containers(t, o)[0].Image
}

// installPodMonitorCRD serves monitoring.coreos.com/v1 PodMonitors and
// PrometheusRules (schema-less stand-ins for the Prometheus operator's
// CRDs), as on a cluster that runs the operator.
func installPodMonitorCRD(t *testing.T) {
	t.Helper()
	if startErr != nil {
		t.Fatal(startErr)
	}
	keep := true
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, kind := range []string{"PodMonitor", "PrometheusRule"} {
		plural := strings.ToLower(kind) + "s"
		crds = append(crds, &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: plural + ".monitoring.coreos.com"},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: "monitoring.coreos.com", Scope: apiextensionsv1.NamespaceScoped,
				Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Singular: strings.ToLower(kind), Kind: kind, ListKind: kind + "List"},
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object", XPreserveUnknownFields: &keep}}}},
			},
		})
	}
	if _, err := envtest.InstallCRDs(restConfig, envtest.CRDInstallOptions{CRDs: crds}); err != nil {
		t.Fatalf("Prometheus operator CRDs: %v", err)
	}
}

func bufioReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }

// TestLinkCAOfYourOwn: a CA given in values is rendered as the controller's
// Secret, and its certificate alone as the agents' ConfigMap; a certificate
// without its key fails the render, naming the value.
func TestLinkCAOfYourOwn(t *testing.T) {
	ca, err := pki.NewCA("my-link-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if err := os.WriteFile(certFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	got := index(render(t, "dowse-own-ca", "--set", "link.enabled=true", "--set-file", "link.ca.cert="+certFile, "--set-file", "link.ca.key="+keyFile))
	sec, cm := got["Secret/dowse-link-ca"], got["ConfigMap/dowse-link-ca-cert"]
	if sec == nil || cm == nil {
		t.Fatalf("a CA given in values renders no Secret (%v) or ConfigMap (%v)", sec != nil, cm != nil)
	}
	var s corev1.Secret
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(sec.Object, &s); err != nil {
		t.Fatal(err)
	}
	if loaded, err := pki.LoadCA(s.Data["tls.crt"], s.Data["tls.key"]); err != nil || !loaded.Cert.Equal(ca.Cert) {
		t.Fatalf("the Secret holds another CA: %v", err)
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	if strings.TrimSpace(data["ca.crt"]) != strings.TrimSpace(string(ca.CertPEM)) || len(data) != 1 {
		t.Errorf("the agents' ConfigMap holds %d keys, want the CA's certificate alone", len(data))
	}
	out, err := kube.HelmCommand(context.Background(), t, "template", chartDir(), "--set", "link.enabled=true", "--set-file", "link.ca.cert="+certFile).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "link.ca.cert needs link.ca.key") {
		t.Errorf("a CA certificate without its key: %v\n%s", err, out)
	}
}
