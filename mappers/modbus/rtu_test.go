package modbus_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	"github.com/dowse-dev/dowse/mappers/modbus"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
	"github.com/dowse-dev/dowse/test/peers/nullmodem"
)

// Modbus RTU over a serial line: modbus-serial's ServerSerial on one end
// of a null-modem pair of pseudo-terminals, the mapper on the other; reads
// of holding registers (a float32 too), a desired value written (the
// server reports the write) and then read back over the same line by
// Debian's mbpoll in RTU mode, once the mapper let go of it.
func TestModbusRTU(t *testing.T) {
	serverEnd, mapperEnd := nullmodem.Open(t)
	srv := npmpeer.StartModbus(t, "modbus-serial-rtu", map[string]any{
		"impl": "modbus-serial", "serialPath": serverEnd, "baudRate": 19200, "parity": "none", "unitId": 7, "logWrites": true,
		"holding": map[string]int{"0": 1234, "1": 0x4146, "2": 0},
	})

	dev := mappertest.NewDevice(t, "default", "rtu", "plc", modbus.Protocol,
		map[string]any{"serialPort": mapperEnd, "baudRate": 19200, "parity": "none", "unitId": 7, "timeout": "1s"},
		prop("count", map[string]any{"register": "holding", "address": 0}),
		prop("flowBig", map[string]any{"register": "holding", "address": 1, "dataType": "float32"}),
		prop("mode", map[string]any{"register": "holding", "address": 10}))
	r := startMapper(t, []*dmiv1beta1.DeviceModel{plcModel}, dev)
	r.agent.WaitState(t, "default/rtu", "ok", wait)
	r.agent.WaitReported(t, "default/rtu", "count", "1234", 0, wait)
	r.agent.WaitReported(t, "default/rtu", "flowBig", "12.375", 0, wait)

	from := r.agent.ReportCount()
	if _, err := r.agent.Mapper(t).UpdateDevice(context.Background(), &dmiv1beta1.UpdateDeviceRequest{Device: mappertest.SetDesired(dev, "mode", "9")}); err != nil {
		t.Fatal(err)
	}
	srv.WaitLine(t, "WRITE 10 9", 0, wait)
	r.agent.WaitReported(t, "default/rtu", "mode", "9", from, wait)

	// The line is the mapper's until it lets go: remove the device, then
	// read the register with mbpoll over the same pseudo-terminal.
	if _, err := r.agent.Mapper(t).RemoveDevice(context.Background(), &dmiv1beta1.RemoveDeviceRequest{DeviceName: "rtu", DeviceNamespace: "default"}); err != nil {
		t.Fatal(err)
	}
	path, err := exec.LookPath("mbpoll")
	if err != nil {
		npmpeer.Unavailable(t, "mbpoll is not installed: run hack/install-deps.sh (Debian mbpoll)")
	}
	var out []byte
	for deadline := time.Now().Add(wait); ; time.Sleep(200 * time.Millisecond) {
		out, err = exec.Command(path, "-m", "rtu", "-b", "19200", "-P", "none", "-a", "7", "-t", "4", "-0", "-r", "10", "-c", "1", "-1", mapperEnd).CombinedOutput()
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	got := ""
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "[10]:"); ok {
			got = strings.TrimSpace(rest)
		}
	}
	if err != nil || got != "9" {
		t.Errorf("mbpoll over RTU reads %q (%v), want 9:\n%s", got, err, out)
	}
}
