package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// cloud is a control plane with dowse-controller (link on) and a way to
// join agents to it, all real binaries.
type cloud struct {
	t                       testing.TB
	cp                      *kube.ControlPlane
	dir, kubeconfig         string
	client                  client.Client
	metrics, ws, quic, auth int
	controller              *procs.Proc
	controllerArgs          []string
	// agentKubeconfig is a node's agent's kubeconfig when it is not the
	// cloud's (an API server reached through a fault proxy).
	agentKubeconfig map[string]string
}

func startCloud(t testing.TB, controllerArgs ...string) *cloud {
	t.Helper()
	c := newCloud(t, controllerArgs...)
	c.startController()
	return c
}

// newCloud is startCloud without the controller.
func newCloud(t testing.TB, controllerArgs ...string) *cloud {
	t.Helper()
	return newCloudWith(t, kube.Options{CRDs: true}, controllerArgs...)
}

// newCloudWith is newCloud on an API server started with o.
func newCloudWith(t testing.TB, o kube.Options, controllerArgs ...string) *cloud {
	t.Helper()
	cp, err := kube.StartWith(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	c := &cloud{t: t, cp: cp, dir: t.TempDir()}
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := cp.Kubeconfig(c.kubeconfig); err != nil {
		t.Fatal(err)
	}
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	if c.client, err = client.New(cp.Config, client.Options{Scheme: sch}); err != nil {
		t.Fatal(err)
	}
	if err := c.client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dowse-system"}}); err != nil {
		t.Fatal(err)
	}
	ports := make([]int, 4)
	for i := range ports {
		if ports[i], err = procs.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	c.metrics, c.ws, c.quic, c.auth = ports[0], ports[1], ports[2], ports[3]
	c.controllerArgs = controllerArgs
	return c
}

func (c *cloud) startController() {
	c.controller = dowse.Controller{Kubeconfig: c.kubeconfig, Metrics: c.metrics, Link: c.link(),
		Args: c.controllerArgs}.StartLogged(c.t, c.dir, "controller")
}

// link is where the cloud's controller serves the link.
func (c *cloud) link() *dowse.Link {
	return &dowse.Link{WebSocket: c.ws, QUIC: c.quic, Auth: c.auth, Heartbeat: time.Second}
}

// start runs a binary with its output in the cloud's directory.
func (c *cloud) start(name, logName string, args ...string) *procs.Proc {
	c.t.Helper()
	return procs.StartLogged(c.t, c.dir, name, logName, args...)
}

// joinAgent creates the Node, mints its token and starts its agent over
// WebSocket to server (the cloudhub when empty); the agent's state
// directory and metrics port are returned.
func (c *cloud) joinAgent(node, server string, extra ...string) (*procs.Proc, string, int) {
	t := c.t
	t.Helper()
	ctx := context.Background()
	if err := c.client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	var tok struct{ Token, CACertHash string }
	testwait.For(t, 30*time.Second, func() error {
		if err := c.client.Get(ctx, client.ObjectKey{Namespace: "dowse-system", Name: "dowse-link-ca"}, &corev1.Secret{}); err != nil {
			return err
		}
		b, err := exec.Command(filepath.Join(procs.BinDir(), "dowsectl"), "token", "create",
			"--kubeconfig", c.kubeconfig, "--node", node, "--ttl", "10m", "--output", "json").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, b)
		}
		return json.Unmarshal(b, &tok)
	})
	port, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(c.dir, node)
	edge := c.link().Edge("websocket")
	if server != "" {
		edge.Server = server
	}
	edge.BootstrapToken, edge.CACertHash = tok.Token, tok.CACertHash
	kubeconfig := c.kubeconfig
	if k, ok := c.agentKubeconfig[node]; ok {
		kubeconfig = k
	}
	p := dowse.Agent{Kubeconfig: kubeconfig, Node: node, StateDir: state, Metrics: port, Link: edge,
		Args: extra}.StartLogged(t, c.dir, node)
	return p, state, port
}

func (c *cloud) apply(t testing.TB, manifest string) {
	t.Helper()
	for _, doc := range strings.Split(manifest, "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		if err := c.client.Apply(context.Background(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("e2e"), client.ForceOwnership); err != nil {
			t.Fatalf("applying %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

// mbpollRead reads holding register ref (0-based) with Debian's mbpoll.
func mbpollRead(t *testing.T, address string, ref int) string {
	t.Helper()
	out := mbpoll(t, address, []string{"-t", "4", "-r", strconv.Itoa(ref), "-c", "1"})
	prefix := "[" + strconv.Itoa(ref) + "]:"
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("mbpoll printed no %s:\n%s", prefix, out)
	return ""
}

// mbpoll runs Debian's mbpoll with options against address, writing
// values when given.
func mbpoll(t *testing.T, address string, options []string, values ...string) string {
	t.Helper()
	path, err := exec.LookPath("mbpoll")
	if err != nil {
		npmpeer.Unavailable(t, "mbpoll is not installed: run hack/install-deps.sh (Debian mbpoll)")
	}
	host, port, _ := net.SplitHostPort(address)
	all := append(append([]string{"-m", "tcp", "-p", port, "-0", "-1"}, options...), host)
	if len(values) > 0 {
		all = append(append(all, "--"), values...)
	}
	out, err := exec.Command(path, all...).CombinedOutput()
	if err != nil {
		t.Fatalf("mbpoll %v: %v\n%s", all, err, out)
	}
	return string(out)
}

const modbusTwinManifest = `apiVersion: dowse.dev/v1alpha1
kind: DeviceModel
metadata: {name: thermostat, namespace: default}
spec:
  protocol: modbus
  properties:
    - {name: setpoint, type: INT, accessMode: ReadWrite, minimum: "0", maximum: "1000",
       visitors: {protocolName: modbus, configData: {register: holding, address: 0, dataType: int16}}}
    - {name: temperature, type: DOUBLE, accessMode: ReadOnly, unit: C,
       visitors: {protocolName: modbus, configData: {register: holding, address: 1, dataType: int16, scale: 0.1}}}
---
apiVersion: dowse.dev/v1alpha1
kind: Configuration
metadata: {name: plc, namespace: default}
spec:
  discoveryHandler:
    name: modbus
    discoveryDetails: {targets: ["%s"], rescanInterval: 500ms}
  deviceTemplate:
    deviceModelRef: {name: thermostat}
    protocol: {protocolName: modbus, configData: {address: "${MODBUS_TCP_ADDRESS}"}}
    properties:
      - {name: setpoint, collectCycle: 100ms, reportCycle: 10s}
      - {name: temperature, collectCycle: 100ms, reportCycle: 10s}
`

// TestModbusTwinEndToEnd: a Modbus server (jsmodbus) found by
// dowse-modbus-discovery becomes an Instance and a Device; the agent hands
// the Device to dowse-modbus-mapper over DMI; a desired value set with
// kubectl and with dowsectl moves the register (read back by mbpoll), and
// the register's value comes back as reported and observedDesired in
// Device.status; a register mbpoll changes is reported too.
func TestModbusTwinEndToEnd(t *testing.T) {
	port := npmpeer.FreePort(t, "127.0.0.1")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	npmpeer.StartModbus(t, "jsmodbus", map[string]any{"impl": "jsmodbus", "host": "127.0.0.1", "port": port, "holding": map[string]int{"0": 5, "1": 215}})

	c := startCloud(t, "--twin-status-interval", "500ms")
	ctx := context.Background()
	_, state, _ := c.joinAgent("edge-1", "")
	c.start("dowse-modbus-discovery", "modbus-discovery", "--state-dir", state)
	c.start("dowse-modbus-mapper", "modbus-mapper", "--state-dir", state, "--name", "plc")
	c.apply(t, fmt.Sprintf(modbusTwinManifest, addr))

	var dev v1alpha1.Device
	testwait.For(t, 90*time.Second, func() error {
		var list v1alpha1.DeviceList
		if err := c.client.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d Devices, want the discovered server's one", len(list.Items))
		}
		dev = list.Items[0]
		if rep, _ := dev.Twin("temperature").Values(); rep != "21.5" {
			return fmt.Errorf("temperature reported %q, want 21.5 (register 215, scale 0.1); status %+v", rep, dev.Status)
		}
		if rep, _ := dev.Twin("setpoint").Values(); rep != "5" {
			return fmt.Errorf("setpoint reported %q, want 5", rep)
		}
		return nil
	})
	if dev.Spec.NodeName != "edge-1" || dev.Status.State != v1alpha1.DeviceStateOK {
		t.Errorf("device node %q state %q: want edge-1 and ok", dev.Spec.NodeName, dev.Status.State)
	}

	setAndSee := func(how, value string, set func()) {
		t.Helper()
		set()
		testwait.For(t, 30*time.Second, func() error {
			if got := mbpollRead(t, addr, 0); got != value {
				return fmt.Errorf("%s: register 0 reads %s, want %s", how, got, value)
			}
			var d v1alpha1.Device
			if err := c.client.Get(ctx, client.ObjectKeyFromObject(&dev), &d); err != nil {
				return err
			}
			rep, obs := d.Twin("setpoint").Values()
			if rep != value || obs != value {
				return fmt.Errorf("%s: setpoint reported %q, observedDesired %q, want %s", how, rep, obs, value)
			}
			if !meta.IsStatusConditionTrue(d.Status.Conditions, v1alpha1.ConditionDesiredApplied) {
				return fmt.Errorf("%s: DesiredApplied not True: %+v", how, d.Status.Conditions)
			}
			return nil
		})
	}
	setAndSee("kubectl", "42", func() {
		i := slices.IndexFunc(dev.Spec.Properties, func(p v1alpha1.DeviceProperty) bool { return p.Name == "setpoint" })
		patch := fmt.Sprintf(`[{"op":"add","path":"/spec/properties/%d/desired","value":{"value":"42"}}]`, i)
		if kubectl, err := exec.LookPath("kubectl"); err == nil {
			if out, err := exec.Command(kubectl, "--kubeconfig", c.kubeconfig, "-n", "default", "patch", "device", dev.Name,
				"--type", "json", "-p", patch).CombinedOutput(); err != nil {
				t.Fatalf("kubectl patch: %v: %s", err, out)
			}
			return
		}
		t.Log("kubectl is not installed: setting the desired value with the API client instead")
		if err := c.client.Patch(ctx, &dev, client.RawPatch(types.JSONPatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	})
	setAndSee("dowsectl twin set", "7", func() {
		if out, err := exec.Command(filepath.Join(procs.BinDir(), "dowsectl"), "twin", "set", dev.Name, "setpoint", "7",
			"--kubeconfig", c.kubeconfig, "-n", "default").CombinedOutput(); err != nil {
			t.Fatalf("dowsectl twin set: %v: %s", err, out)
		}
	})
	// dowsectl refuses what the model forbids, before any write.
	if out, err := exec.Command(filepath.Join(procs.BinDir(), "dowsectl"), "twin", "set", dev.Name, "setpoint", "5000",
		"--kubeconfig", c.kubeconfig, "-n", "default").CombinedOutput(); err == nil || !strings.Contains(string(out), "above the maximum") {
		t.Errorf("dowsectl twin set 5000: %v %s, want a refusal naming the maximum", err, out)
	}
	// A register changed behind the twin's back comes back as reported.
	mbpoll(t, addr, []string{"-t", "4", "-r", "1"}, "65413") // -123 as a 16-bit two's complement
	testwait.For(t, 30*time.Second, func() error {
		var d v1alpha1.Device
		if err := c.client.Get(ctx, client.ObjectKeyFromObject(&dev), &d); err != nil {
			return err
		}
		if rep, _ := d.Twin("temperature").Values(); rep != "-12.3" {
			return fmt.Errorf("temperature reported %q, want -12.3 after mbpoll wrote 0xff85 (int16 -123, scale 0.1)", rep)
		}
		return nil
	})
}
