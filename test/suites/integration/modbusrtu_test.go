//go:build linux

package integration

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/dowse-dev/dowse/discovery-handlers/modbus"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/nullmodem"
	"github.com/dowse-dev/dowse/test/peers/pymodbus"
)

// TestModbusRTUUnitsBecomeInstances runs the real modbus-rtu handler beside
// an agent against pymodbus serving units 2 and 9 at 9600 baud, 8N1, on a
// null-modem pair of pseudo-terminals: each unit is an Instance of the
// node (not shared) with its line settings in the properties and the
// serial port as its device node, for its broker. (The framings tried
// differ in stop bits: this kernel's pseudo-terminals do not carry parity.)
func TestModbusRTUUnitsBecomeInstances(t *testing.T) {
	pymodbus.Check(t)
	slaveEnd, port := nullmodem.OpenLine(t)
	pymodbus.StartRTU(t, pymodbus.Config{Port: slaveEnd, BaudRate: 9600, Parity: "N", Units: map[int]pymodbus.Unit{
		2: {Holding: map[int]int{0: 4711}}, 9: {Holding: map[int]int{0: 4711}}}})
	ns := suite.Namespace(t)
	dir := stateDir(t)
	const node = "rtu-node"
	startAgent(t, node, dir)
	cfg := modbus.RTUHandler()
	cfg.StateDir, cfg.Logger = dir, testr.New(t).WithName("modbus-rtu")
	handlertest.Serve(t, cfg)

	createConfiguration(t, ns, "rtu", modbus.RTUName, fmt.Sprintf(`{"serialPorts": [%q], "baudRates": [19200, 9600], "framings": ["8N2", "8N1"],
		"unitIds": ["1-10"], "timeout": "100ms", "rescanInterval": "2s", "match": {"registers": [{"offset": 0, "equals": 4711}]}}`, port))
	expectCount(t, ns, "rtu", 2, 60*time.Second)
	node2, _ := filepath.EvalSymlinks(port)
	testwait.For(t, 10*time.Second, func() error {
		var list v1alpha1.InstanceList
		if err := suite.Client.List(t.Context(), &list); err != nil {
			return err
		}
		units := map[string]bool{}
		for _, i := range list.Items {
			if i.Namespace != ns || i.Spec.ConfigurationName != "rtu" {
				continue
			}
			p := i.Spec.BrokerProperties
			if i.Spec.Shared || p[modbus.SerialPortProperty] != port || p[modbus.BaudRateProperty] != "9600" || p[modbus.ParityProperty] != "none" ||
				len(i.Spec.DeviceSpecs) != 1 || i.Spec.DeviceSpecs[0].HostPath != node2 || i.Spec.DeviceSpecs[0].ContainerPath != port {
				return fmt.Errorf("Instance %s: shared %v, properties %v, device specs %+v", i.Name, i.Spec.Shared, p, i.Spec.DeviceSpecs)
			}
			units[p[modbus.UnitIDProperty]] = true
		}
		if !units["2"] || !units["9"] || len(units) != 2 {
			return fmt.Errorf("units %v, want 2 and 9", units)
		}
		return nil
	})
}
