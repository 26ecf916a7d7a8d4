package node

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// linkTwinManifest is a Modbus thermostat whose setpoint is a twin; no
// mapper Pod (the mapper runs as a process beside the agent).
const linkTwinManifest = `apiVersion: dowse.dev/v1alpha1
kind: DeviceModel
metadata: {name: link-thermostat, namespace: default}
spec:
  protocol: modbus
  properties:
    - {name: setpoint, type: INT, accessMode: ReadWrite, minimum: "0", maximum: "1000",
       visitors: {protocolName: modbus, configData: {register: holding, address: 0, dataType: int16}}}
---
apiVersion: dowse.dev/v1alpha1
kind: Configuration
metadata: {name: link-plc, namespace: default}
spec:
  discoveryHandler:
    name: modbus
    discoveryDetails: {targets: ["%s"], rescanInterval: 1s}
  deviceTemplate:
    deviceModelRef: {name: link-thermostat}
    protocol: {protocolName: modbus, configData: {address: "${MODBUS_TCP_ADDRESS}"}}
    properties:
      - {name: setpoint, collectCycle: 100ms, reportCycle: 10s}
`

// linkTwin is a Modbus twin whose device sits next to an edge node: its
// desired values go down the node's link to dowse-modbus-mapper, and what
// the register holds comes back up into Device.status.
type linkTwin struct {
	cl  client.WithWatch
	dev *v1alpha1.Device
	// setpoint is the index of the setpoint in the Device's spec.
	setpoint int
	next     int
}

// startLinkTwin runs jsmodbus on the node network's host side, and
// dowse-modbus-discovery and dowse-modbus-mapper in the node's namespace
// beside the agent whose state folder is agentState, and waits for the
// Device to report the register.
func startLinkTwin(t *testing.T, ctx context.Context, c *cluster.Cluster, agentState string) *linkTwin {
	t.Helper()
	plc := npmpeer.StartModbus(t, "jsmodbus", map[string]any{"impl": "jsmodbus", "host": c.PodNetwork.HostIP, "holding": map[string]int{"0": 5}})
	for _, bin := range [][2]string{{"dowse-modbus-discovery", ""}, {"dowse-modbus-mapper", "link-plc"}} {
		args := []string{"--state-dir", agentState}
		if bin[1] != "" {
			args = append(args, "--name", bin[1])
		}
		name, args := c.PodNetwork.Command(filepath.Join(procs.BinDir(), bin[0]), args)
		out := procs.NewLines()
		p, err := procs.Run(bin[0], name, args, procs.Options{Stdout: out, Stderr: out, DieWithCaller: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			p.Stop()
			if t.Failed() {
				t.Logf("%s:\n%s", bin[0], out)
			}
		})
	}
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.NewWithWatch(c.Config, client.Options{Scheme: sch})
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(fmt.Sprintf(linkTwinManifest, plc.Address), "\n---\n")
	for i, obj := range []client.Object{&v1alpha1.DeviceModel{}, &v1alpha1.Configuration{}} {
		if err := yaml.UnmarshalStrict([]byte(docs[i]), obj); err != nil {
			t.Fatal(err)
		}
		if err := cl.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	lt := &linkTwin{cl: cl, next: 100}
	testwait.For(t, 2*time.Minute, func() error {
		var l v1alpha1.DeviceList
		if err := cl.List(ctx, &l, client.InNamespace("default")); err != nil {
			return err
		}
		if len(l.Items) != 1 {
			return fmt.Errorf("%d Devices, want the PLC's one", len(l.Items))
		}
		lt.dev = &l.Items[0]
		if rep, _ := lt.dev.Twin("setpoint").Values(); rep != "5" {
			return fmt.Errorf("setpoint reported %q, want the register's 5", rep)
		}
		return nil
	})
	lt.setpoint = slices.IndexFunc(lt.dev.Spec.Properties, func(p v1alpha1.DeviceProperty) bool { return p.Name == "setpoint" })
	return lt
}

// roundTrips sets desired values one after another, each once the last came
// back (reported and observed in Device.status), n of them or, with n 0,
// until stop is closed; it returns each round trip's time.
func (lt *linkTwin) roundTrips(ctx context.Context, n int, stop <-chan struct{}) ([]time.Duration, error) {
	w, err := lt.cl.Watch(ctx, &v1alpha1.DeviceList{}, client.InNamespace("default"))
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var took []time.Duration
	for i := 0; n == 0 || i < n; i++ {
		if stop != nil {
			select {
			case <-stop:
				return took, nil
			default:
			}
		}
		lt.next = 100 + (lt.next-99)%900
		v := strconv.Itoa(lt.next)
		patch := fmt.Appendf(nil, `[{"op":"add","path":"/spec/properties/%d/desired","value":{"value":%q}}]`, lt.setpoint, v)
		began := time.Now()
		if err := lt.cl.Patch(ctx, lt.dev, client.RawPatch(types.JSONPatchType, patch)); err != nil {
			return took, fmt.Errorf("setting setpoint %s: %w", v, err)
		}
		if err := waitTwinValue(w, lt.dev.Name, v); err != nil {
			return took, err
		}
		took = append(took, time.Since(began))
	}
	return took, nil
}

func waitTwinValue(w watch.Interface, name, v string) error {
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("the Device watch ended waiting for setpoint %s", v)
			}
			if d, ok := ev.Object.(*v1alpha1.Device); ok && d.Name == name {
				if rep, obs := d.Twin("setpoint").Values(); rep == v && obs == v {
					return nil
				}
			}
		case <-timeout:
			return fmt.Errorf("desired setpoint %s not reported and observed in Device.status within 30 s", v)
		}
	}
}
