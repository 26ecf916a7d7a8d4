package modbus_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dowse-dev/dowse/discovery-handlers/modbus"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

const wait = 15 * time.Second

// commonPort returns a port free on every host.
func commonPort(t *testing.T, hosts ...string) int {
	t.Helper()
	for range 20 {
		port := npmpeer.FreePort(t, hosts[0])
		free := true
		for _, h := range hosts[1:] {
			l, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(port)))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			return port
		}
	}
	t.Fatalf("no port free on all of %v", hosts)
	return 0
}

func runHandler(t *testing.T) string {
	t.Helper()
	cfg := modbus.Handler()
	cfg.Logger = testr.New(t)
	reg := handlertest.Run(t, cfg)
	if reg.GetName() != modbus.DefaultName || !reg.GetShared() {
		t.Errorf("registration = %v, want name %s, shared", reg, modbus.DefaultName)
	}
	return reg.GetEndpoint()
}

func waitFor(t *testing.T, s *handlertest.Stream, want ...string) []*discoveryv1.Device {
	t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(wait)
	for {
		devs := s.Next(t, time.Until(deadline))
		got := handlertest.IDs(devs)
		if slices.Equal(got, want) || (len(got) == 0 && len(want) == 0) {
			return devs
		}
		t.Logf("devices %q, waiting for %q", got, want)
	}
}

func unitID(address string, unit int) string { return address + "/" + strconv.Itoa(unit) }

// mbpoll writes value to holding register 0 of unit on address with
// Debian's mbpoll, an independent Modbus client.
func mbpoll(t *testing.T, address string, unit, value int) {
	t.Helper()
	path, err := exec.LookPath("mbpoll")
	if err != nil && os.Geteuid() == 0 {
		if out, err := exec.Command("apt-get", "install", "-y", "mbpoll").CombinedOutput(); err != nil {
			t.Logf("apt-get install -y mbpoll: %v\n%s", err, out)
		}
		path, err = exec.LookPath("mbpoll")
	}
	if err != nil {
		npmpeer.Unavailable(t, "mbpoll is not installed: apt-get install -y mbpoll")
	}
	host, port, _ := net.SplitHostPort(address)
	args := []string{"-m", "tcp", "-a", strconv.Itoa(unit), "-p", port, "-t", "4", "-0", "-r", "0", "-1", host, strconv.Itoa(value)}
	if out, err := exec.Command(path, args...).CombinedOutput(); err != nil {
		t.Fatalf("mbpoll %v: %v\n%s", args, err, out)
	}
}

// TestModbusPeers runs every scenario against jsmodbus and modbus-serial
// servers on loopback addresses.
func TestModbusPeers(t *testing.T) {
	endpoint := runHandler(t)
	port := commonPort(t, "127.0.0.10", "127.0.0.20", "127.0.0.30")
	// jsmodbus answers every unit id.
	js := npmpeer.StartModbus(t, "jsmodbus", map[string]any{"impl": "jsmodbus", "host": "127.0.0.10", "port": port})
	// modbus-serial answers unit 3 only, and identifies itself.
	ms := npmpeer.StartModbus(t, "modbus-serial", map[string]any{"impl": "modbus-serial", "host": "127.0.0.20", "port": port, "unitId": 3,
		"identification": map[string]string{"0": "Acme", "1": "PC-7", "2": "1.2", "4": "Pump controller", "128": "SN-0042"}})

	discover := func(details string) *handlertest.Stream {
		return handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: details})
	}

	t.Run("single target", func(t *testing.T) {
		s := discover(fmt.Sprintf(`{"targets": [%q], "rescanInterval": "200ms"}`, js.Address))
		dev := waitFor(t, s, unitID(js.Address, 1))[0]
		if p := dev.GetProperties(); p[modbus.AddressProperty] != js.Address || p[modbus.UnitIDProperty] != "1" {
			t.Errorf("properties = %v", p)
		}
	})

	t.Run("unit ids and identification", func(t *testing.T) {
		s := discover(fmt.Sprintf(`{"targets": [%q], "unitIds": [1, 2, 3], "timeout": "300ms", "rescanInterval": "200ms",
			"probe": {"identify": true, "serialObjectId": 128}}`, ms.Address))
		dev := waitFor(t, s, "Acme/PC-7/SN-0042")[0]
		want := map[string]string{
			modbus.AddressProperty: ms.Address, modbus.UnitIDProperty: "3", modbus.VendorNameProperty: "Acme",
			modbus.ProductCodeProperty: "PC-7", modbus.RevisionProperty: "1.2", modbus.ProductNameProperty: "Pump controller",
			modbus.SerialNumberProperty: "SN-0042",
		}
		for k, v := range want {
			if got := dev.GetProperties()[k]; got != v {
				t.Errorf("%s = %q, want %q (all: %v)", k, got, v, dev.GetProperties())
			}
		}

		// Read Device Identification as the probe: modbus-serial answers
		// it, jsmodbus answers "illegal function" and is no device.
		s = discover(fmt.Sprintf(`{"targets": [%q, %q], "unitIds": [3], "rescanInterval": "200ms", "probe": {"function": "deviceIdentification"},
			"match": {"identification": {"vendorName": "^Acme$"}}}`, js.Address, ms.Address))
		waitFor(t, s, unitID(ms.Address, 3))
		s = discover(fmt.Sprintf(`{"targets": [%q], "unitIds": [3], "rescanInterval": "200ms", "probe": {"function": "deviceIdentification"},
			"match": {"identification": {"vendorName": "^Other"}}}`, ms.Address))
		waitFor(t, s)
	})

	t.Run("a /24 with two live servers", func(t *testing.T) {
		// Default concurrency, rate and timeout. modbus-serial leaves unit 1
		// unanswered, so one target costs a full timeout.
		start := time.Now()
		s := discover(fmt.Sprintf(`{"targets": ["127.0.0.0/24"], "ports": [%d], "unitIds": [1, 3]}`, port))
		devs := s.Next(t, 30*time.Second)
		took := time.Since(start)
		want := []string{unitID(js.Address, 1), unitID(js.Address, 3), unitID(ms.Address, 3)}
		slices.Sort(want)
		if got := handlertest.IDs(devs); !slices.Equal(got, want) {
			t.Errorf("first list %q, want %q", got, want)
		}
		t.Logf("FIGURE: Modbus scan of 254 targets (127.0.0.0/24, one port, unit ids 1 and 3, default %d probes/s, timeout %v) with two live servers: %v",
			modbus.DefaultProbesPerSecond, modbus.DefaultTimeout, took.Round(time.Millisecond))
		if took > 5*time.Second {
			t.Errorf("scan took %v, the goal is under 5s", took)
		}
	})

	t.Run("match follows values written with mbpoll", func(t *testing.T) {
		s := discover(fmt.Sprintf(`{"targets": [%q, %q], "unitIds": [1, 3], "timeout": "300ms", "rescanInterval": "200ms", "failureThreshold": 1,
			"probe": {"address": 0, "count": 2}, "match": {"registers": [{"offset": 0, "equals": 42}]}}`, js.Address, ms.Address))
		waitFor(t, s)
		mbpoll(t, js.Address, 1, 42)
		waitFor(t, s, unitID(js.Address, 1), unitID(js.Address, 3))
		mbpoll(t, ms.Address, 3, 42)
		waitFor(t, s, unitID(js.Address, 1), unitID(js.Address, 3), unitID(ms.Address, 3))
		mbpoll(t, js.Address, 1, 7)
		waitFor(t, s, unitID(ms.Address, 3))
		mbpoll(t, ms.Address, 3, 0)
		waitFor(t, s)
	})

	t.Run("server goes away and comes back", func(t *testing.T) {
		const interval, threshold = 200 * time.Millisecond, 3
		gone := npmpeer.StartModbus(t, "jsmodbus-2", map[string]any{"impl": "jsmodbus", "host": "127.0.0.30", "port": port})
		s := discover(fmt.Sprintf(`{"targets": [%q, %q], "rescanInterval": %q, "failureThreshold": %d}`, js.Address, gone.Address, interval, threshold))
		waitFor(t, s, unitID(js.Address, 1), unitID(gone.Address, 1))
		// From before Stop: the server stops answering while Stop still
		// waits for its process to exit.
		stopped := time.Now()
		gone.Stop()
		waitFor(t, s, unitID(js.Address, 1))
		if took, min := time.Since(stopped), time.Duration(threshold-1)*interval; took < min {
			t.Errorf("dropped %v after the server stopped, want at least %v (%d rounds %v apart)", took, min, threshold, interval)
		}
		gone.Restart(t)
		waitFor(t, s, unitID(js.Address, 1), unitID(gone.Address, 1))
	})

	t.Run("bad details", func(t *testing.T) {
		err := discover(`{"targets": ["127.0.0.0/16"]}`).Err(t, wait)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "targets[0]") {
			t.Errorf("stream error = %v, want InvalidArgument naming targets[0]", err)
		}
		t.Logf("a /16 is refused with: %v", status.Convert(err).Message())
	})
}
