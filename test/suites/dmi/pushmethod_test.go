package dmi_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/controller/link/twins"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/link/pki"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/kubeedgepeer"
	"github.com/dowse-dev/dowse/test/peers/mosquitto"
)

// kubeEdgeDevice is a Device with a property pushed to MQTT, written as
// KubeEdge's documentation writes one (apiVersion aside).
const kubeEdgeDevice = `
apiVersion: dowse.dev/v1alpha1
kind: Device
metadata:
  name: thermo-push
  namespace: default
spec:
  deviceModelRef:
    name: thermo
  nodeName: edge-1
  protocol:
    protocolName: virtual
    configData:
      address: sim://thermo-push
  properties:
    - name: temp
      collectCycle: 100
      reportCycle: 200
      reportToCloud: true
      visitors:
        protocolName: virtual
        configData:
          initial: 21
      pushMethod:
        mqtt:
          address: %s
          topic: dowse/thermo-push/temp
          qos: 1
          retained: false
`

// TestKubeEdgeMapperPushesToMQTT: a Device's pushMethod travels the link
// and reaches a mapper built on KubeEdge's mapper-framework in DMI's
// Device as edgecore fills it, and that mapper publishes the property's
// readings to a real mosquitto (checked with mosquitto_sub) while the twin
// goes on reporting to the cloud.
func TestKubeEdgeMapperPushesToMQTT(t *testing.T) {
	broker := mosquitto.Start(t)
	sub := broker.Subscribe(t, "dowse/#", 1, "")
	tmp := t.TempDir()
	bin := kubeedgepeer.Build(t, tmp, kubeedgepeer.V123)
	stateDir := filepath.Join(tmp, "state")
	mapperDir := filepath.Join(tmp, "mapper")
	if err := os.MkdirAll(mapperDir, 0o700); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCA("dowse-dmi-push-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srvCert, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, err := ca.IssueNode(node, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := startCloud(t, pki.ServerTLSConfig(pki.Static[*tls.ClientHelloInfo](srvCert), ca.Pool()), "127.0.0.1:0")
	dialer, err := link.NewDialer(link.WebSocket, c.addr(), pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](nodeCert), ca.Pool(), "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	logs := procs.NewLines()
	agent := startAgent(t, stateDir, dialer, logs, true)
	waitFor(t, "link up", func() error {
		if !agent.hub.Connected() {
			return fmt.Errorf("not connected")
		}
		return nil
	})
	m := kubeedgepeer.Start(t, bin, mapperDir, filepath.Join(stateDir, "dmi", "dmi.sock"))
	waitFor(t, "mapper registers", func() error {
		if m.Out.Count("EVENT registered") != 1 {
			return fmt.Errorf("mapper stdout:\n%s\nstderr:\n%s", m.Out, m.Stderr)
		}
		return nil
	})

	var d v1alpha1.Device
	if err := yaml.UnmarshalStrict([]byte(fmt.Sprintf(kubeEdgeDevice, broker.Addr())), &d); err != nil {
		t.Fatal(err)
	}
	var model v1alpha1.DeviceModel
	model.Namespace, model.Name = "default", "thermo"
	model.Spec.Protocol = "virtual"
	model.Spec.Properties = []v1alpha1.ModelProperty{{Name: "temp", Type: v1alpha1.PropertyInt, AccessMode: v1alpha1.ReadOnly}}
	if err := d.Validate(&model); err != nil {
		t.Fatal(err)
	}
	ed, err := twins.EdgeDevice(&d, &model)
	if err != nil {
		t.Fatal(err)
	}
	c.send(t, &linkv1.Envelope{Kind: &linkv1.Envelope_ModelUpdate{ModelUpdate: &linkv1.DeviceModelUpdate{Model: twins.EdgeModel(&model)}}})
	c.send(t, &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceUpdate{DeviceUpdate: &linkv1.DeviceUpdate{Device: ed}}})

	waitFor(t, "the framework mapper publishes to mosquitto", func() error {
		if n := sub.Count("dowse/thermo-push/temp", "dowse/thermo-push/temp: 21"); n < 3 {
			return fmt.Errorf("mosquitto_sub saw %d readings, want 3; it printed %q\nmapper stdout:\n%s\nstderr:\n%s", n, sub.Lines(), m.Out, m.Stderr)
		}
		return nil
	})
	for _, l := range sub.Lines() {
		if !strings.HasPrefix(l, "dowse/thermo-push/temp time is ") {
			t.Errorf("mosquitto_sub printed %q: want the template's \"time is ...  topic: value\"", l)
		}
	}
	waitFor(t, "the twin reports on meanwhile", func() error {
		if len(c.find(func(r *linkv1.TwinReportedUpdate) bool { return r.Device.GetName() == "thermo-push" })) == 0 {
			return fmt.Errorf("no report of thermo-push reached the cloud")
		}
		return nil
	})
	_ = context.Background
}
