package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/kubeedgepeer"
)

// watchDevices watches the Devices of namespace default until t ends.
func (c *cloud) watchDevices(t testing.TB) watch.Interface {
	t.Helper()
	wc, err := client.NewWithWatch(c.cp.Config, client.Options{Scheme: c.client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(context.Background(), &v1alpha1.DeviceList{}, client.InNamespace("default"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

// joinKubeEdgeMapper joins node edge-1 to c and runs bin, the framework
// mapper, on its agent's dmi.sock until it has registered.
func (c *cloud) joinKubeEdgeMapper(t testing.TB, bin string) *kubeedgepeer.Mapper {
	t.Helper()
	_, state, _ := c.joinAgent("edge-1", "")
	dmiSock := filepath.Join(state, "dmi", "dmi.sock")
	testwait.For(t, 60*time.Second, func() error { _, err := os.Stat(dmiSock); return err })
	m := kubeedgepeer.Start(t, bin, t.TempDir(), dmiSock)
	testwait.For(t, 30*time.Second, func() error {
		if m.Out.Count("EVENT registered") == 0 {
			return fmt.Errorf("the mapper has not registered:\n%s", m.Out)
		}
		return nil
	})
	return m
}

const kubeEdgeTwinManifest = `apiVersion: dowse.dev/v1alpha1
kind: DeviceModel
metadata: {name: thermo, namespace: default}
spec:
  protocol: virtual
  properties:
    - {name: temp, type: INT, accessMode: ReadWrite, minimum: "0", maximum: "100"}
    - {name: label, type: STRING, accessMode: ReadOnly}
    - {name: level, type: INT, accessMode: ReadOnly}
---
apiVersion: dowse.dev/v1alpha1
kind: Device
metadata: {name: thermo-1, namespace: default}
spec:
  deviceModelRef: {name: thermo}
  nodeName: edge-1
  protocol: {protocolName: virtual, configData: {address: "sim://thermo-1", slaveID: 1}}
  properties:
    - name: temp
      desired: {value: "25"}
      visitors: {protocolName: virtual, configData: {initial: 20}}
      collectCycle: 200ms
      reportCycle: 1s
    - name: label
      visitors: {protocolName: virtual, configData: {initial: lab-1}}
      collectCycle: 200
      pushMethod:
        anomalyDetection: {service: "http://127.0.0.1:9/detect", window: 10}
    - name: level
      visitors: {protocolName: virtual, configData: {initial: high}}
      collectCycle: 200
  stateReport: {reportToCloud: true, reportCycle: 2s}
`

// TestKubeEdgeMapperEndToEnd: with the real binaries (controller with the
// link on, agent), a mapper built on KubeEdge's own mapper-framework
// runtime, v1.21.0 and v1.23.0, registers with the agent's dmi.sock exactly
// as it would with edgecore and gets the Device written by hand, its
// stateReport as edgecore 1.23 hands it (and, to v1.23, a pushMethod's
// anomalyDetection); its desired value, and the ones set later with kubectl
// and with dowsectl twin set, reach the mapper and come back as reported
// and observedDesired in Device.status, with the mapper's state; a property
// whose reads do not parse is refused alone and named in ReportsAccepted.
func TestKubeEdgeMapperEndToEnd(t *testing.T) {
	for _, v := range kubeedgepeer.Versions {
		t.Run(v, func(t *testing.T) { kubeEdgeMapperEndToEnd(t, v) })
	}
}

func kubeEdgeMapperEndToEnd(t *testing.T, version string) {
	bin := kubeedgepeer.Build(t, t.TempDir(), version)
	c := startCloud(t, "--twin-status-interval", "500ms")
	ctx := context.Background()
	m := c.joinKubeEdgeMapper(t, bin)
	c.apply(t, kubeEdgeTwinManifest)

	key := client.ObjectKey{Namespace: "default", Name: "thermo-1"}
	see := func(how, value string) {
		t.Helper()
		testwait.For(t, 60*time.Second, func() error {
			if m.Out.Count("EVENT device-started id=default/thermo-1 desired=temp:"+value) == 0 {
				return fmt.Errorf("%s: the mapper has not applied temp=%s:\n%s", how, value, m.Out)
			}
			var d v1alpha1.Device
			if err := c.client.Get(ctx, key, &d); err != nil {
				return err
			}
			rep, obs := d.Twin("temp").Values()
			if rep != value || obs != value {
				return fmt.Errorf("%s: temp reported %q, observedDesired %q, want %s; status %+v", how, rep, obs, value, d.Status)
			}
			if rep, _ := d.Twin("label").Values(); rep != "lab-1" {
				return fmt.Errorf("%s: label reported %q, want lab-1", how, rep)
			}
			if d.Status.State != v1alpha1.DeviceStateOK {
				return fmt.Errorf("%s: state %q, want ok", how, d.Status.State)
			}
			if !meta.IsStatusConditionTrue(d.Status.Conditions, v1alpha1.ConditionDesiredApplied) {
				return fmt.Errorf("%s: DesiredApplied not True: %+v", how, d.Status.Conditions)
			}
			// level reads "high", not an INT: refused alone, and named.
			if rep, _ := d.Twin("level").Values(); rep != "" {
				return fmt.Errorf("%s: level reported %q, want nothing", how, rep)
			}
			if c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionReportsAccepted); c == nil || c.Status != metav1.ConditionFalse ||
				!strings.Contains(c.Message, `property "level": reported value "high" is not an INT`) {
				return fmt.Errorf("%s: ReportsAccepted %+v, want False naming level", how, c)
			}
			return nil
		})
	}
	see("the Device's own desired value", "25")
	if m.Out.Count("EVENT device-started id=default/thermo-1 desired=temp:25 states=true state-cycle=2000") == 0 {
		t.Errorf("the mapper did not get spec.stateReport (states every 2000 ms):\n%s", m.Out)
	}
	if ad := m.Out.Count(`EVENT anomaly-detection id=default/thermo-1 property=label config={"service":"http://127.0.0.1:9/detect","window":10}`); (ad > 0) != (version != kubeedgepeer.V121) {
		t.Errorf("mapper-framework %s: %d anomaly detection configurations for label, want them from v1.23 on:\n%s", version, ad, m.Out)
	}

	patch := `[{"op":"replace","path":"/spec/properties/0/desired","value":{"value":"42"}}]`
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		if out, err := exec.Command(kubectl, "--kubeconfig", c.kubeconfig, "-n", "default", "patch", "device", "thermo-1",
			"--type", "json", "-p", patch).CombinedOutput(); err != nil {
			t.Fatalf("kubectl patch: %v: %s", err, out)
		}
	} else {
		t.Log("kubectl is not installed: setting the desired value with the API client instead")
		var d v1alpha1.Device
		if err := c.client.Get(ctx, key, &d); err != nil {
			t.Fatal(err)
		}
		if err := c.client.Patch(ctx, &d, client.RawPatch(types.JSONPatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	see("kubectl", "42")

	if out, err := exec.Command(filepath.Join(procs.BinDir(), "dowsectl"), "twin", "set", "thermo-1", "temp", "7",
		"--kubeconfig", c.kubeconfig, "-n", "default").CombinedOutput(); err != nil {
		t.Fatalf("dowsectl twin set: %v: %s", err, out)
	}
	see("dowsectl twin set", "7")
}
