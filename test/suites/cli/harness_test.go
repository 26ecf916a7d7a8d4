// Package cli tests dowsectl as people use it: the real binary run by a
// real kubectl as the plugin `kubectl dowse`, and the console in a real
// browser (Debian's chromium, over the DevTools protocol), against the
// real API server, controller, agent (joined to the cloud/edge link),
// debug-echo and Modbus handlers, the Modbus mapper and a jsmodbus peer.
// One cluster serves every subtest of TestDowsectl, in order.
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/scheme"
	readingsv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// ns holds the test's objects.
const ns = "plant"

// rig is the cluster every subtest shares.
type rig struct {
	// top is TestDowsectl's: what outlives one subtest is stopped with it.
	top        *testing.T
	cp         *kube.ControlPlane
	dir        string
	kubeconfig string
	client     client.Client
	cs         kubernetes.Interface
	// pathDir holds dowsectl, kubectl-dowse and kubectl_complete-dowse,
	// links to bin/dowsectl, as a user's PATH would.
	pathDir string
	kubectl string
	// state is the agent's state directory, where the handlers and the
	// mapper meet it.
	state      string
	modbusAddr string
	// closedAddr is a Modbus target nothing listens on.
	closedAddr string
	// readings is the controller's port for the live readings API, which
	// the API server reaches once testConsoleLive registers its APIService.
	readings int
	// plc is the Modbus controller's Device once it reported, plcErr why
	// it did not (later subtests then fail at once).
	plc    *v1alpha1.Device
	plcErr error
}

// startLogged runs bin/<name> with its output in dir/<name>.log, shown when
// the test fails, and stops it when the test ends.
func startLogged(t *testing.T, dir, name string, args ...string) *procs.Proc {
	t.Helper()
	return procs.StartLogged(t, dir, name, name, args...)
}

// kubectlPath is the kubectl the tests run: the test cluster's build
// (hack/build-k8s.sh), else one on PATH outside CI.
func kubectlPath(t *testing.T) string {
	t.Helper()
	p := filepath.Join(kube.BinDir(), "kubectl")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if os.Getenv("CI") != "true" {
		if p, err := exec.LookPath("kubectl"); err == nil {
			return p
		}
	}
	npmpeer.Unavailable(t, "%s is missing: run `make k8s` (hack/build-k8s.sh builds kubectl)", p)
	return ""
}

func startRig(t *testing.T) *rig {
	t.Helper()
	for _, b := range []string{"dowsectl", "dowse-controller", "dowse-agent", "dowse-debug-echo-discovery", "dowse-modbus-discovery", "dowse-modbus-mapper"} {
		if _, err := os.Stat(filepath.Join(procs.BinDir(), b)); err != nil {
			t.Fatalf("%s is missing from %s: run `make build` first", b, procs.BinDir())
		}
	}
	r := &rig{top: t, dir: t.TempDir(), kubectl: kubectlPath(t)}
	port := npmpeer.FreePort(t, "127.0.0.1")
	r.modbusAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// holding 0: setpoint 5; holding 1: temperature 21.5 (scale 0.1);
	// input 3: a register the model wrongly calls writable.
	npmpeer.StartModbus(t, "jsmodbus", map[string]any{"impl": "jsmodbus", "host": "127.0.0.1", "port": port, "holding": map[string]int{"0": 5, "1": 215}, "input": map[string]int{"3": 7}})

	// The API server can aggregate the live readings API (registered by
	// testConsoleLive only).
	cp, err := kube.StartWith(kube.Options{CRDs: true, Aggregator: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	r.cp = cp
	r.kubeconfig = filepath.Join(r.dir, "kubeconfig")
	if err := cp.Kubeconfig(r.kubeconfig); err != nil {
		t.Fatal(err)
	}
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	if r.client, err = client.New(cp.Config, client.Options{Scheme: sch}); err != nil {
		t.Fatal(err)
	}
	if r.cs, err = kubernetes.NewForConfig(cp.Config); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []string{"dowse-system", ns} {
		if err := r.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	r.pathDir = filepath.Join(r.dir, "path")
	if err := os.MkdirAll(r.pathDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, link := range []string{"dowsectl", "kubectl-dowse", "kubectl_complete-dowse"} {
		if err := os.Symlink(filepath.Join(procs.BinDir(), "dowsectl"), filepath.Join(r.pathDir, link)); err != nil {
			t.Fatal(err)
		}
	}

	ports := make([]int, 5)
	for i := range ports {
		if ports[i], err = procs.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	link := &dowse.Link{WebSocket: ports[1], QUIC: ports[2], Auth: ports[3], Heartbeat: time.Second}
	r.readings = ports[4]
	dowse.Controller{Kubeconfig: r.kubeconfig, Metrics: ports[0], Link: link,
		TwinStatusInterval: 300 * time.Millisecond,
		Args: []string{"--readings-address", fmt.Sprintf("127.0.0.1:%d", r.readings), "--readings-service", readingsService,
			"--readings-apiservice", readingsv1.APIServiceName}}.StartLogged(t, r.dir, "dowse-controller")
	if err := r.client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"}}); err != nil {
		t.Fatal(err)
	}
	// The agent joins the link with a token minted by the plugin, once the
	// controller has made the link CA it serves with.
	var tok struct{ Token, CACertHash string }
	testwait.For(t, 60*time.Second, func() error {
		if err := r.client.Get(ctx, client.ObjectKey{Namespace: "dowse-system", Name: "dowse-link-ca"}, &corev1.Secret{}); err != nil {
			return err
		}
		out, errOut, err := r.kubectlRun("dowse", "-n", "dowse-system", "token", "create", "--node", "edge-1", "--ttl", "10m", "-o", "json")
		if err != nil {
			return fmt.Errorf("%w: %s", err, errOut)
		}
		return json.Unmarshal([]byte(out), &tok)
	})
	r.state = filepath.Join(r.dir, "edge-1")
	agentMetrics, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	edge := link.Edge("websocket")
	edge.BootstrapToken, edge.CACertHash = tok.Token, tok.CACertHash
	dowse.Agent{Kubeconfig: r.kubeconfig, Node: "edge-1", StateDir: r.state, Metrics: agentMetrics,
		Link: edge}.StartLogged(t, r.dir, "dowse-agent")
	startLogged(t, r.dir, "dowse-debug-echo-discovery", "--state-dir", r.state)
	startLogged(t, r.dir, "dowse-modbus-discovery", "--state-dir", r.state)
	startLogged(t, r.dir, "dowse-modbus-mapper", "--state-dir", r.state, "--name", "plc")
	// A second target nobody serves: the handler reports it skipped.
	closed, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	r.closedAddr = fmt.Sprintf("127.0.0.1:%d", closed)
	r.apply(t, fmt.Sprintf(manifests, r.modbusAddr, r.closedAddr))
	return r
}

// manifests are the demo's kind of objects: pretend devices of the
// debug-echo handler, and a Modbus controller (the jsmodbus peer) found by
// the Modbus handler whose Device the Modbus mapper serves.
const manifests = `apiVersion: dowse.dev/v1alpha1
kind: Configuration
metadata: {name: debug-echo, namespace: plant}
spec:
  discoveryHandler: {name: debug-echo, discoveryDetails: {descriptions: [foo0]}}
  capacity: 2
  brokerProperties: {GREETING: hello}
---
apiVersion: dowse.dev/v1alpha1
kind: DeviceModel
metadata: {name: thermostat, namespace: plant}
spec:
  protocol: modbus
  properties:
    - {name: setpoint, type: INT, accessMode: ReadWrite, minimum: "5", maximum: "30",
       visitors: {protocolName: modbus, configData: {register: holding, address: 0, dataType: int16}}}
    - {name: temperature, type: DOUBLE, accessMode: ReadOnly, unit: C,
       visitors: {protocolName: modbus, configData: {register: holding, address: 1, dataType: int16, scale: 0.1}}}
    - {name: limit, type: INT, accessMode: ReadWrite, description: "an input register: the device refuses writes",
       visitors: {protocolName: modbus, configData: {register: input, address: 3, dataType: int16}}}
---
apiVersion: dowse.dev/v1alpha1
kind: Configuration
metadata: {name: plc, namespace: plant}
spec:
  discoveryHandler:
    name: modbus
    discoveryDetails: {targets: ["%s", "%s"], rescanInterval: 500ms}
  deviceTemplate:
    deviceModelRef: {name: thermostat}
    protocol: {protocolName: modbus, configData: {address: "${MODBUS_TCP_ADDRESS}"}}
    properties:
      - {name: setpoint, collectCycle: 100ms, reportCycle: 10s}
      - {name: temperature, collectCycle: 100ms, reportCycle: 10s}
      - {name: limit, collectCycle: 100ms, reportCycle: 10s}
`

func (r *rig) apply(t *testing.T, manifest string) {
	t.Helper()
	for _, doc := range strings.Split(manifest, "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		if err := r.client.Apply(context.Background(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("test"), client.ForceOwnership); err != nil {
			t.Fatalf("applying %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

// env is the environment of the commands the tests run: the links on
// PATH, a HOME of the test's own (kubectl's caches go there).
func (r *rig) env() []string {
	return append(os.Environ(), "PATH="+r.pathDir+string(os.PathListSeparator)+os.Getenv("PATH"), "HOME="+r.dir, "KUBECONFIG="+r.kubeconfig)
}

// kubectlRun runs the real kubectl; the plugin needs no flag of ours to
// find the cluster (kubectl hands it KUBECONFIG's environment).
func (r *rig) kubectlRun(args ...string) (string, string, error) {
	cmd := exec.Command(r.kubectl, args...)
	cmd.Env = r.env()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// plugin runs `kubectl dowse args...` in the test namespace; stdout, and
// stderr in the error.
func (r *rig) plugin(args ...string) (string, error) {
	out, errOut, err := r.kubectlRun(append([]string{"dowse", "-n", ns}, args...)...)
	if err != nil {
		return out, fmt.Errorf("kubectl dowse %s: %w: %s", strings.Join(args, " "), err, errOut)
	}
	return out, nil
}

// mbpoll runs Debian's mbpoll against the peer.
func (r *rig) mbpoll(t *testing.T, options []string, values ...string) string {
	t.Helper()
	if _, err := exec.LookPath("mbpoll"); err != nil {
		npmpeer.Unavailable(t, "mbpoll is not installed: run hack/install-deps.sh (Debian mbpoll)")
	}
	out, err := r.mbpollRun(options, values...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// mbpollRun is mbpoll for a goroutine: its failure is returned.
func (r *rig) mbpollRun(options []string, values ...string) (string, error) {
	path, err := exec.LookPath("mbpoll")
	if err != nil {
		return "", err
	}
	host, port, _ := net.SplitHostPort(r.modbusAddr)
	all := append(append([]string{"-m", "tcp", "-p", port, "-0", "-1"}, options...), host)
	if len(values) > 0 {
		all = append(append(all, "--"), values...)
	}
	out, err := exec.Command(path, all...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("mbpoll %v: %w\n%s", all, err, out)
	}
	return string(out), nil
}

// holding reads holding register ref with mbpoll.
func (r *rig) holding(t *testing.T, ref int) string {
	t.Helper()
	out := r.mbpoll(t, []string{"-t", "4", "-r", strconv.Itoa(ref), "-c", "1"})
	prefix := "[" + strconv.Itoa(ref) + "]:"
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("mbpoll printed no %s:\n%s", prefix, out)
	return ""
}

// plcDevice waits for the Modbus controller's Device to report and returns
// it.
func (r *rig) plcDevice(t *testing.T) *v1alpha1.Device {
	t.Helper()
	if r.plcErr != nil {
		t.Fatalf("the Modbus controller's Device never reported: %v", r.plcErr)
	}
	if r.plc != nil {
		return r.plc.DeepCopy()
	}
	var dev v1alpha1.Device
	r.plcErr = fmt.Errorf("not yet")
	defer func() {
		if r.plc == nil {
			r.plcErr = fmt.Errorf("no report within 2 minutes")
		}
	}()
	testwait.For(t, 120*time.Second, func() error {
		var list v1alpha1.DeviceList
		if err := r.client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d Devices, want the discovered controller's one", len(list.Items))
		}
		dev = list.Items[0]
		if rep := reported(&dev, "temperature"); rep == "" {
			return fmt.Errorf("no temperature reported yet; status %+v", dev.Status)
		}
		return nil
	})
	r.plc, r.plcErr = dev.DeepCopy(), nil
	return &dev
}

func reported(d *v1alpha1.Device, prop string) string {
	rep, _ := d.Twin(prop).Values()
	return rep
}

// TestDowsectl runs everything on one cluster, in order: the plugin's
// commands and formats, twin set --wait against the mapper, the console
// in a browser (on Device.status, then on the live readings API), and last the API server restart that twin watch and the
// console must ride out.
func TestDowsectl(t *testing.T) {
	r := startRig(t)
	t.Run("Plugin", func(t *testing.T) { testPlugin(t, r) })
	t.Run("Completion", func(t *testing.T) { testCompletion(t, r) })
	t.Run("Convert", func(t *testing.T) { testConvert(t, r) })
	t.Run("SetWait", func(t *testing.T) { testSetWait(t, r) })
	t.Run("Console", func(t *testing.T) { testConsole(t, r) })
	t.Run("ConsoleLive", func(t *testing.T) { testConsoleLive(t, r) })
	t.Run("WatchAcrossRestart", func(t *testing.T) { testWatchAcrossRestart(t, r) })
}
