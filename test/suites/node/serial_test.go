package node

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/handler"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
	"github.com/dowse-dev/dowse/test/peers/nullmodem"
)

// mapperImage is the Modbus mapper's image, loaded into the node.
var mapperImage = [2]string{"./mappers/modbus/cmd/dowse-modbus-mapper", "ghcr.io/dowse-dev/dowse-modbus-mapper:latest"}

// serialPort is where the port appears in the mapper's container.
const serialPort = "/dev/ttyDOWSE0"

// ptyHandler is a discovery handler (on the handler SDK, registered with
// the agent like any other) that reports one serial port: the mapper's end
// of a pseudo-terminal pair, handed as a bind mount at serialPort, and its
// container path as SERIAL_PORT.
//
// Why not the udev handler: a Unix98 pty has no sysfs entry (the kernel
// registers /dev/pts/N in devpts only), so neither udevd nor the kernel's
// uevents ever announce it. Why a mount, not a device node: a pty's slave
// opens only through its own devpts inode (the kernel finds the terminal
// from it: a node made for it with mknod opens with EIO), and the runtime
// makes a CDI device node anew in the container (tried: the mapper found
// no port to open). So it reaches the container as a CDI bind mount of the
// Instance's device, which every container's device rules allow (136:*,
// as for its own /dev/pts). A real USB serial port goes the udev handler's
// way, as a device node; everything after discovery is the same.
type ptyHandler struct {
	hostPath string
	// containerPath is where the port appears (serialPort when empty).
	containerPath string
}

func (h ptyHandler) Discover(ctx context.Context, _ *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
	at := h.containerPath
	if at == "" {
		at = serialPort
	}
	if err := send([]*discoveryv1.Device{{
		Id:         "pty" + h.hostPath,
		Properties: map[string]string{"SERIAL_PORT": at},
		Mounts:     []*discoveryv1.Mount{{HostPath: h.hostPath, ContainerPath: at}},
	}}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// rtuConfiguration makes the Devices of the pty handler's port twins of
// samples/modbus-plc-model.yaml over Modbus RTU, served by the mapper Pod
// the controller runs.
const rtuConfiguration = `
apiVersion: dowse.dev/v1alpha1
kind: Configuration
metadata: {name: rtu, namespace: default}
spec:
  discoveryHandler: {name: pty-serial}
  capacity: 1
  deviceTemplate:
    deviceModelRef: {name: modbus-plc}
    protocol:
      protocolName: modbus
      configData: {serialPort: "${SERIAL_PORT}", baudRate: 19200, parity: none, unitId: 7, timeout: 1s}
    properties:
      - {name: setpoint, collectCycle: 500ms}
      - {name: flow, collectCycle: 500ms}
    mapperPodSpec:
      hostNetwork: true
      containers:
        - name: mapper
          image: ghcr.io/dowse-dev/dowse-modbus-mapper:latest
          imagePullPolicy: Never
`

// testSerialMapper proves on the real node that a serial device reaches its
// mapper through the Instance's device: a pseudo-terminal pair is the
// serial line, modbus-serial's RTU server (npm, a real peer) holds one end,
// the other is the Instance's device; the controller's Modbus mapper Pod
// gets it through the device plugin and CDI (no hostPath but the agent's
// state directory, not privileged); the RTU server's registers reach
// Device.status and a desired value reaches its register. It runs on a
// cluster whose agent, controller and link are up (TestChartOnNode's), with
// the mapper's image loaded, and removes what it made.
func testSerialMapper(t *testing.T, ctx context.Context, c *cluster.Cluster, cl client.Client, stateDir string) {
	serverEnd, deviceEnd := nullmodem.Open(t)
	// setpoint (holding 0) 17; flow (holding 1-2, float32, low word
	// first) 12.375.
	srv := npmpeer.StartModbus(t, "modbus-serial-rtu", map[string]any{"impl": "modbus-serial", "serialPath": serverEnd, "baudRate": 19200, "parity": "none",
		"unitId": 7, "logWrites": true, "holding": map[string]int{"0": 17, "1": 0, "2": 0x4146}})

	serveHandler(t, ctx, handler.Config{Name: "pty-serial", StateDir: stateDir,
		Discoverer: ptyHandler{hostPath: deviceEnd}, Logger: testr.New(t).WithName("pty-serial")})
	model := loadModel(t, "modbus-plc-model.yaml")
	model.Name = "modbus-plc"
	if err := cl.Create(ctx, model); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	var cfg v1alpha1.Configuration
	if err := yaml.UnmarshalStrict([]byte(rtuConfiguration), &cfg); err != nil {
		t.Fatal(err)
	}
	mport, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Spec.DeviceTemplate.MapperPodSpec.Containers[0].Args = []string{fmt.Sprintf("--metrics-address=127.0.0.1:%d", mport)}
	if err := cl.Create(ctx, &cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		deleteMapped(t, ctx, cl, &cfg)
		_ = cl.Delete(context.Background(), model)
	})
	inst := waitInstances(t, ctx, cl, cfg.Name, 1)[0]
	if len(inst.Spec.Mounts) != 1 || inst.Spec.Mounts[0].HostPath != deviceEnd {
		t.Fatalf("the Instance carries %+v, want the pty %s", inst.Spec.Mounts, deviceEnd)
	}

	// The mapper Pod runs, asks for the Instance's slot and holds no
	// hostPath but the state directory (its dmi.sock), unprivileged.
	var pod corev1.Pod
	eventuallyNode(t, ctx, 2*time.Minute, func() error {
		var pods corev1.PodList
		if err := cl.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels{v1alpha1.LabelMapper: "true"}); err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				pod = p
				return nil
			}
			for _, st := range p.Status.ContainerStatuses {
				if st.State.Terminated != nil || st.LastTerminationState.Terminated != nil {
					return fmt.Errorf("mapper pod %s: %+v\n%s", p.Name, st, podLogs(t, ctx, c.Client, p.Name))
				}
			}
		}
		return fmt.Errorf("no Running mapper pod among %d", len(pods.Items))
	})
	mc := pod.Spec.Containers[0]
	if q := mc.Resources.Limits[corev1.ResourceName(inst.ResourceName())]; q.Value() != 1 {
		t.Fatalf("the mapper pod does not ask for the Instance's %s: %v", inst.ResourceName(), mc.Resources.Limits)
	}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path != stateDir+"/dmi" {
			t.Fatalf("the mapper pod mounts hostPath %s", v.HostPath.Path)
		}
	}
	for _, ctr := range pod.Spec.Containers {
		if sc := ctr.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
			t.Fatalf("the mapper container %s is privileged", ctr.Name)
		}
	}

	// The RTU server's registers reach Device.status over the line.
	waitTwin(t, ctx, cl, "setpoint", "17")
	dev := waitTwin(t, ctx, cl, "flow", "12.375")
	// A desired value reaches the register, and comes back as reported.
	from := srv.Lines()
	setDesired(t, ctx, cl, dev, "setpoint", "30")
	srv.WaitLine(t, "WRITE 0 30", from, time.Minute)
	waitTwin(t, ctx, cl, "setpoint", "30")
	t.Logf("mapper pod %s got %s through %s; setpoint 17 and flow 12.375 read over RTU, desired 30 written to the server's register and reported",
		pod.Name, deviceEnd, inst.ResourceName())
}

// rtuHandlerPort is where the chart's Modbus RTU handler finds its port.
const rtuHandlerPort = "/dev/ttyDOWSE1"

// serialPortsResource is the slot of the serial-ports Configuration the
// chart's Modbus RTU handler asks for (its resources.limits).
var serialPortsResource = v1alpha1.ResourceName("default", "serial-ports")

// testSerialRTUHandler proves on the real node that the chart's Modbus RTU
// handler, unprivileged (a user of its own, no privileges, no hostPath but
// the agent's sockets and udev's database), opens the serial port a Dowse
// slot gives it and finds the unit on that line: a pseudo-terminal pair is
// the line, modbus-serial's RTU server (npm) holds one end and answers as
// unit 7; the other end is the device of a serial-ports Configuration
// (here the pty handler's; on real hardware the udev handler's), owned by
// group dialout as a USB adapter's port is; the handler's DaemonSet asks
// for that Configuration's slot (the chart's modbusRtu.discovery.resources)
// and runs in group dialout (supplementalGroups).
func testSerialRTUHandler(t *testing.T, ctx context.Context, c *cluster.Cluster, cl client.Client, stateDir string) {
	const dialout = 20
	serverEnd, deviceEnd := nullmodem.Open(t)
	if err := os.Chown(deviceEnd, 0, dialout); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(deviceEnd, 0o660); err != nil {
		t.Fatal(err)
	}
	npmpeer.StartModbus(t, "modbus-serial-rtu", map[string]any{"impl": "modbus-serial", "serialPath": serverEnd, "baudRate": 19200, "parity": "none",
		"unitId": 7, "holding": map[string]int{"0": 17}})

	serveHandler(t, ctx, handler.Config{Name: "pty-port", StateDir: stateDir,
		Discoverer: ptyHandler{hostPath: deviceEnd, containerPath: rtuHandlerPort}, Logger: testr.New(t).WithName("pty-port")})
	ports := &v1alpha1.Configuration{}
	ports.Name, ports.Namespace = "serial-ports", "default"
	ports.Spec.DiscoveryHandler.Name = "pty-port"
	ports.Spec.Capacity = 1
	units := &v1alpha1.Configuration{}
	units.Name, units.Namespace = "rtu-units", "default"
	units.Spec.DiscoveryHandler.Name = "modbus-rtu"
	units.Spec.DiscoveryHandler.DiscoveryDetails = &apiextensionsv1.JSON{Raw: []byte(fmt.Sprintf(
		`{"serialPorts": [%q], "baudRates": [19200], "framings": ["8N1"], "unitIds": [5, 7], "timeout": "500ms", "rescanInterval": "1s"}`, rtuHandlerPort))}
	for _, cfg := range []*v1alpha1.Configuration{ports, units} {
		if err := cl.Create(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, cfg := range []*v1alpha1.Configuration{units, ports} {
			_ = cl.Delete(context.Background(), cfg)
			waitInstances(t, ctx, cl, cfg.Name, 0)
		}
	})
	waitInstances(t, ctx, cl, ports.Name, 1)

	// The handler's pod runs once the slot is there, unprivileged.
	var pod corev1.Pod
	eventuallyNode(t, ctx, 2*time.Minute, func() error {
		var pods corev1.PodList
		if err := cl.List(ctx, &pods, client.InNamespace("dowse-system"), client.MatchingLabels{"app.kubernetes.io/name": "dowse-modbus-rtu-discovery"}); err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				pod = p
				return nil
			}
		}
		return fmt.Errorf("no Running Modbus RTU handler pod among %d", len(pods.Items))
	})
	if q := pod.Spec.Containers[0].Resources.Limits[corev1.ResourceName(serialPortsResource)]; q.Value() != 1 {
		t.Fatalf("the handler pod does not ask for %s: %v", serialPortsResource, pod.Spec.Containers[0].Resources.Limits)
	}
	if sc := pod.Spec.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Fatalf("the handler pod runs as root: %+v", sc)
	}
	for _, ctr := range pod.Spec.Containers {
		if sc := ctr.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
			t.Fatalf("the handler container %s is privileged", ctr.Name)
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path != stateDir+"/discovery" && v.HostPath.Path != "/run/udev" {
			t.Fatalf("the handler pod mounts hostPath %s", v.HostPath.Path)
		}
	}

	// It opens the port and finds unit 7 (and not 5, which is silent).
	inst := waitInstances(t, ctx, cl, units.Name, 1)[0]
	if p := inst.Spec.BrokerProperties; p["MODBUS_SERIAL_PORT"] != rtuHandlerPort || p["MODBUS_UNIT_ID"] != "7" || p["MODBUS_BAUD_RATE"] != "19200" {
		t.Fatalf("the unit's Instance %s has %v", inst.Name, p)
	}
	t.Logf("the chart's Modbus RTU handler (pod %s, uid %d, groups %v) opened %s through %s and found unit 7",
		pod.Name, *pod.Spec.SecurityContext.RunAsUser, pod.Spec.SecurityContext.SupplementalGroups, deviceEnd, serialPortsResource)
}
