package modbus_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/dowse-dev/dowse/discovery-handlers/modbus"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/peers/nullmodem"
	"github.com/dowse-dev/dowse/test/peers/pymodbus"
)

func runRTUHandler(t *testing.T) string {
	t.Helper()
	cfg := modbus.RTUHandler()
	cfg.Logger = testr.New(t)
	reg := handlertest.Run(t, cfg)
	if reg.GetName() != modbus.RTUName || reg.GetShared() {
		t.Errorf("registration = %v, want name %s, not shared", reg, modbus.RTUName)
	}
	return reg.GetEndpoint()
}

// TestModbusRTUPeers runs the modbus-rtu handler against pymodbus (Debian's
// python3-pymodbus) serving units 3 and 7 at 19200 baud, 8N2, on one end of
// a null-modem pair of pseudo-terminals that, like a real line, carries
// nothing while its two ends disagree on speed or framing. The handler
// probes the other end. (Linux 6.18's pseudo-terminals do not carry
// parity or 7 data bits: pyserial's tcsetattr of PARENB fails with EINVAL,
// so the framings that tell the line apart here differ in stop bits.)
func TestModbusRTUPeers(t *testing.T) {
	pymodbus.Check(t)
	endpoint := runRTUHandler(t)
	slaveEnd, port := nullmodem.OpenLine(t)
	pymodbus.StartRTU(t, pymodbus.Config{Port: slaveEnd, BaudRate: 19200, Parity: "N", StopBits: 2, Units: map[int]pymodbus.Unit{
		3: {Holding: map[int]int{0: 4711, 1: 1}},
		7: {Holding: map[int]int{0: 815, 1: 2}},
	}})
	// Each stream is closed at its subtest's end: streams of one port take
	// turns on it.
	discover := func(t *testing.T, details string) *handlertest.Stream {
		return handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: details})
	}
	id := func(unit int) string { return fmt.Sprintf("%s/%d", port, unit) }

	t.Run("unit ids at the right baud rate and not others", func(t *testing.T) {
		// 9600 first: nothing answers there, so every unit costs a
		// timeout before 19200 is tried.
		start := time.Now()
		s := discover(t, fmt.Sprintf(`{"serialPorts": [%q], "baudRates": [9600, 19200, 38400], "framings": ["8N1", "8E1", "8N2"],
			"unitIds": ["1-10"], "timeout": "100ms", "rescanInterval": "500ms"}`, port))
		devs := waitFor(t, s, id(3), id(7))
		t.Logf("FIGURE: Modbus RTU discovery of 10 unit ids on one port (2 live), found at the 6th of 9 line settings (100ms timeout): first list after %v",
			time.Since(start).Round(time.Millisecond))
		for _, dev := range devs {
			p := dev.GetProperties()
			want := map[string]string{modbus.SerialPortProperty: port, modbus.BaudRateProperty: "19200", modbus.ParityProperty: "none",
				modbus.DataBitsProperty: "8", modbus.StopBitsProperty: "2"}
			for k, v := range want {
				if p[k] != v {
					t.Errorf("%s: %s = %q, want %q (all: %v)", dev.GetId(), k, p[k], v, p)
				}
			}
			if !strings.HasSuffix(dev.GetId(), "/"+p[modbus.UnitIDProperty]) {
				t.Errorf("%s: unit id property %q", dev.GetId(), p[modbus.UnitIDProperty])
			}
			node, _ := filepath.EvalSymlinks(port)
			if specs := dev.GetDeviceSpecs(); len(specs) != 1 || specs[0].GetContainerPath() != port || specs[0].GetHostPath() != node || specs[0].GetPermissions() != "rw" {
				t.Errorf("%s: device specs %v, want %s as itself, rw", dev.GetId(), specs, port)
			}
		}
	})

	t.Run("no unit at a wrong baud rate or framing", func(t *testing.T) {
		s := discover(t, fmt.Sprintf(`{"serialPorts": [%q], "baudRates": [9600, 38400], "framings": ["8N2"], "unitIds": [3, 7], "timeout": "100ms", "rescanInterval": "300ms"}`, port))
		waitFor(t, s)
		s.Close()
		s = discover(t, fmt.Sprintf(`{"serialPorts": [%q], "baudRates": [19200], "framings": ["8N1"], "unitIds": [3, 7], "timeout": "100ms", "rescanInterval": "300ms"}`, port))
		waitFor(t, s)
	})

	t.Run("match on registers", func(t *testing.T) {
		s := discover(t, fmt.Sprintf(`{"serialPorts": [%q], "framings": ["8N2"], "unitIds": ["2-8"], "timeout": "100ms", "rescanInterval": "300ms",
			"probe": {"address": 0, "count": 2}, "match": {"registers": [{"offset": 0, "equals": 4711}, {"offset": 1, "max": 1}]}}`, port))
		waitFor(t, s, id(3))
	})

	t.Run("a pattern names the port", func(t *testing.T) {
		// /dev/pts/N as the pattern /dev/pts/[N]: found once though named
		// twice; a pattern that matches nothing finds nothing.
		dir, n := filepath.Split(port)
		pattern := dir + "[" + n[:1] + "]" + n[1:]
		s := discover(t, fmt.Sprintf(`{"serialPorts": [%q, %q, "/dev/pts/nonesuch*"], "framings": ["8N2"], "unitIds": [7], "timeout": "100ms", "rescanInterval": "300ms"}`, pattern, port))
		waitFor(t, s, id(7))
	})
}

// TestModbusRTUSkipped: the node's status says why units and ports gave
// no device.
func TestModbusRTUSkipped(t *testing.T) {
	pymodbus.Check(t)
	endpoint := runRTUHandler(t)
	slaveEnd, port := nullmodem.OpenLine(t)
	pymodbus.StartRTU(t, pymodbus.Config{Port: slaveEnd, BaudRate: 9600, Parity: "N", Units: map[int]pymodbus.Unit{5: {Holding: map[int]int{0: 1}}}})
	s := handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(
		`{"serialPorts": [%q, "/dev/ttyDOWSE-absent"], "baudRates": [9600], "framings": ["8N1"], "unitIds": [4, 5], "timeout": "100ms", "rescanInterval": "300ms",
		  "match": {"registers": [{"offset": 0, "equals": 2}]}}`, port)})
	deadline := time.Now().Add(wait)
	for {
		resp := s.NextResponse(t, time.Until(deadline))
		reasons := map[string][]string{}
		for _, r := range resp.GetSkipped() {
			for _, c := range r.GetCandidates() {
				reasons[r.GetReason()] = append(reasons[r.GetReason()], c.GetCandidate()+": "+c.GetMessage())
			}
		}
		noMatch, noReply := reasons[modbus.SkipNoMatch], reasons[modbus.SkipNoReply]
		absent := slices.ContainsFunc(noReply, func(s string) bool { return strings.HasPrefix(s, "/dev/ttyDOWSE-absent: no such device") })
		unit4 := slices.ContainsFunc(noReply, func(s string) bool { return strings.HasPrefix(s, port+" unit 4: no answer") })
		if len(resp.GetDevices()) == 0 && len(noMatch) == 1 && strings.HasPrefix(noMatch[0], port+" unit 5: register 0 is 1") && len(noReply) == 2 && absent && unit4 {
			t.Logf("skipped: %v", reasons)
			return
		}
		t.Logf("devices %v, skipped %v; waiting", handlertest.IDs(resp.GetDevices()), reasons)
	}
}

func TestModbusRTUBadDetails(t *testing.T) {
	endpoint := runRTUHandler(t)
	for details, field := range map[string]string{
		`{}`:                         "serialPorts",
		`{"serialPorts": ["ttyS0"]}`: "serialPorts[0]",
		`{"serialPorts": ["/dev/ttyS0"], "baudRates": [12345]}`: "baudRates[0]",
		`{"serialPorts": ["/dev/ttyS0"], "framings": ["9X1"]}`:  "framings[0]",
		`{"serialPorts": ["/dev/ttyS0"], "unitIds": ["1-247"]}`: "maxUnitIds",
		`{"serialPorts": ["/dev/ttyS0"], "unitIds": [0]}`:       "unitIds[0]",
		`{"udevRules": ["SUBSYSTEM=\"tty\""]}`:                  "udevRules[0]",
	} {
		err := handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: details}).Err(t, wait)
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: stream error %v, want one naming %s", details, err, field)
		}
	}
}
