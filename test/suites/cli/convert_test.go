package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/peers/kubeedgepeer"
)

// testConvert: `kubectl dowse convert` on the samples Akri and KubeEdge
// ship writes objects the API server takes as Dowse's (server-side dry run
// against the CRDs), and says what it changed or left out.
func testConvert(t *testing.T, r *rig) {
	samples, err := filepath.Glob(filepath.Join(kube.RepoRoot(), "internal", "dowsectl", "convert", "testdata", "*.yaml"))
	if err != nil || len(samples) < 6 {
		t.Fatalf("samples: %v %v", samples, err)
	}
	args := []string{"dowse", "convert"}
	for _, s := range samples {
		args = append(args, "-f", s)
	}
	out, errOut, err := r.kubectlRun(args...)
	if err != nil {
		t.Fatalf("kubectl dowse convert: %v\n%s", err, errOut)
	}
	if !strings.Contains(errOut, "converted 7 of 7 objects") || !strings.Contains(errOut, `"debugEcho" became "debug-echo"`) ||
		!strings.Contains(errOut, "status: not carried over") {
		t.Errorf("convert said:\n%s", errOut)
	}
	converted := filepath.Join(r.dir, "converted.yaml")
	if err := os.WriteFile(converted, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	applied, errOut, err := r.kubectlRun("apply", "--dry-run=server", "-f", converted)
	if err != nil {
		t.Fatalf("the API server refused what convert wrote: %v\n%s\n%s", err, errOut, out)
	}
	for _, want := range []string{"configuration.dowse.dev/akri-onvif-video", "configuration.dowse.dev/akri-opcua", "configuration.dowse.dev/akri-udev-video",
		"configuration.dowse.dev/akri-debug-echo-foo", "devicemodel.dowse.dev/modbus-01", "device.dowse.dev/modbus-instance-01", "device.dowse.dev/onvif-device-01"} {
		if !strings.Contains(applied, want) {
			t.Errorf("kubectl apply --dry-run=server did not take %s:\n%s", want, applied)
		}
	}

	// KubeEdge 1.23's shapes, written from its own v1beta1 Go types.
	kubeEdge := filepath.Join(r.dir, "kubeedge-1.23.yaml")
	if err := os.WriteFile(kubeEdge, kubeedgepeer.Objects(t), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = r.kubectlRun("dowse", "convert", "-f", kubeEdge)
	if err != nil {
		t.Fatalf("kubectl dowse convert of KubeEdge 1.23's objects: %v\n%s", err, errOut)
	}
	if !strings.Contains(errOut, "converted 6 of 8 objects") || !strings.Contains(errOut, "devicestatus/default/modbus-plc-1: not converted") ||
		strings.Contains(errOut, "not carried over: Dowse") {
		t.Errorf("convert said:\n%s", errOut)
	}
	for _, want := range []string{"stateReport:", "reportCycle: 10000", "anomalyDetection:", "threshold: 3", "protocolConfigData:", "influxdb2ClientConfig:"} {
		if !strings.Contains(out, want) {
			t.Errorf("converted objects lack %q:\n%s", want, out)
		}
	}
	if err := os.WriteFile(converted, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	applied, errOut, err = r.kubectlRun("apply", "--dry-run=server", "-f", converted)
	if err != nil {
		t.Fatalf("the API server refused what convert wrote of KubeEdge 1.23's objects: %v\n%s\n%s", err, errOut, out)
	}
	for _, want := range []string{"devicemodel.dowse.dev/modbus-plc", "device.dowse.dev/modbus-plc-1", "devicemodel.dowse.dev/opcua-server",
		"device.dowse.dev/opcua-server-1", "devicemodel.dowse.dev/onvif-camera", "device.dowse.dev/onvif-camera-1"} {
		if !strings.Contains(applied, want) {
			t.Errorf("kubectl apply --dry-run=server did not take %s:\n%s", want, applied)
		}
	}
}
