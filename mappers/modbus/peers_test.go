package modbus_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	"github.com/dowse-dev/dowse/mappers/modbus"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

const wait = 15 * time.Second

// mbpoll runs Debian's mbpoll, an independent Modbus client, and returns
// its output.
func mbpoll(t *testing.T, address string, args ...string) string {
	t.Helper()
	// Installing it is hack/install-deps.sh's job, never a test's.
	path, err := exec.LookPath("mbpoll")
	if err != nil {
		npmpeer.Unavailable(t, "mbpoll is not installed: run hack/install-deps.sh (Debian mbpoll)")
	}
	host, port, _ := net.SplitHostPort(address)
	all := append([]string{"-m", "tcp", "-p", port, "-0", "-1"}, args...)
	all = append(all, host)
	out, err := exec.Command(path, all...).CombinedOutput()
	if err != nil {
		t.Fatalf("mbpoll %v: %v\n%s", all, err, out)
	}
	return string(out)
}

// mbpollRead returns the value mbpoll prints for one reference.
func mbpollRead(t *testing.T, address string, ref int, args ...string) string {
	t.Helper()
	out := mbpoll(t, address, append(args, "-r", strconv.Itoa(ref))...)
	prefix := "[" + strconv.Itoa(ref) + "]:"
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("mbpoll printed no %s:\n%s", prefix, out)
	return ""
}

func mbpollWrite(t *testing.T, address string, ref int, value string, args ...string) {
	t.Helper()
	args = append(args, "-r", strconv.Itoa(ref))
	host, port, _ := net.SplitHostPort(address)
	path, _ := exec.LookPath("mbpoll")
	if path == "" {
		mbpoll(t, address) // installs or reports it missing
		path, _ = exec.LookPath("mbpoll")
	}
	all := append([]string{"-m", "tcp", "-p", port, "-0", "-1"}, args...)
	all = append(all, host, "--", value)
	if out, err := exec.Command(path, all...).CombinedOutput(); err != nil {
		t.Fatalf("mbpoll %v: %v\n%s", all, err, out)
	}
}

type mapperRun struct {
	agent   *mappertest.Agent
	metrics *mapper.Metrics
}

// startMapper runs the Modbus mapper in-process against a fake agent that
// hands it devices.
func startMapper(t *testing.T, models []*dmiv1beta1.DeviceModel, devices ...*dmiv1beta1.Device) *mapperRun {
	t.Helper()
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData(models, devices)
	metrics := mapper.NewMetrics()
	mappertest.RunMapper(t, mapper.Config{Protocol: modbus.Protocol, StateDir: dir, NewDriver: modbus.NewDriver, Logger: testr.New(t),
		Metrics: metrics, DefaultCollectCycle: 50 * time.Millisecond, ReconnectInitial: 50 * time.Millisecond,
		ReconnectMax: 200 * time.Millisecond, ReregisterInterval: time.Hour})
	return &mapperRun{agent: agent, metrics: metrics}
}

var plcModel = mappertest.NewModel("default", "plc",
	mappertest.ModelProp("count", "INT", "ReadWrite", "0", "1000"),
	mappertest.ModelProp("temperature", "DOUBLE", "ReadOnly", "", ""),
	mappertest.ModelProp("flowBig", "FLOAT", "ReadWrite", "", ""),
	mappertest.ModelProp("flowLittle", "FLOAT", "ReadWrite", "", ""),
	mappertest.ModelProp("signed", "INT", "ReadOnly", "", ""),
	mappertest.ModelProp("pump", "BOOLEAN", "ReadWrite", "", ""),
	mappertest.ModelProp("alarm", "BOOLEAN", "ReadOnly", "", ""),
	mappertest.ModelProp("mode", "INT", "ReadWrite", "0", "15"),
	mappertest.ModelProp("past", "INT", "ReadOnly", "", ""),
	mappertest.ModelProp("wrong", "INT", "ReadOnly", "", ""),
)

func plcDevice(t *testing.T, name, address string, unit int, props ...mappertest.Prop) *dmiv1beta1.Device {
	return mappertest.NewDevice(t, "default", name, "plc", modbus.Protocol,
		map[string]any{"address": address, "unitId": unit, "timeout": "300ms"}, props...)
}

func prop(name string, visitor map[string]any) mappertest.Prop {
	return mappertest.Prop{Name: name, Visitor: visitor}
}

// float32 12.375 is 0x4146 0x0000.
var plcMemory = map[string]any{
	"holding":  map[string]int{"0": 1234, "1": 0x4146, "2": 0, "3": 0, "4": 0x4146, "5": 0xfffb, "6": 0x0a50},
	"input":    map[string]int{"0": 655},
	"coils":    map[string]int{"3": 1},
	"discrete": map[string]int{"5": 1},
}

func plcProps() []mappertest.Prop {
	return []mappertest.Prop{
		prop("count", map[string]any{"register": "holding", "address": 0}),
		prop("flowBig", map[string]any{"register": "holding", "address": 1, "dataType": "float32"}),
		prop("flowLittle", map[string]any{"register": "holding", "address": 3, "dataType": "float32", "wordOrder": "little"}),
		prop("signed", map[string]any{"register": "holding", "address": 5, "dataType": "int16"}),
		prop("mode", map[string]any{"register": "holding", "address": 6, "bitMask": "0x0f00"}),
		prop("temperature", map[string]any{"register": "input", "address": 0, "scale": 0.1, "offset": -40}),
		prop("pump", map[string]any{"register": "coil", "address": 3}),
		prop("alarm", map[string]any{"register": "discreteInput", "address": 5}),
	}
}

func withMemory(cfg map[string]any) map[string]any {
	for k, v := range plcMemory {
		cfg[k] = v
	}
	return cfg
}

// TestModbusMapperPeers runs the mapper against jsmodbus and modbus-serial
// servers on loopback, cross-checked with mbpoll.
func TestModbusMapperPeers(t *testing.T) {
	js := npmpeer.StartModbus(t, "jsmodbus", withMemory(map[string]any{"impl": "jsmodbus", "host": "127.0.0.11"}))
	ms := npmpeer.StartModbus(t, "modbus-serial", withMemory(map[string]any{"impl": "modbus-serial", "host": "127.0.0.12"}))
	hung := hangingPeer(t, "127.0.0.13")

	jsDev := plcDevice(t, "js", js.Address, 1, plcProps()...)
	msProps := append(plcProps(),
		prop("past", map[string]any{"register": "holding", "address": 600}),
		prop("wrong", map[string]any{"register": "holding", "address": 7, "dataType": "int128"}))
	msDev := plcDevice(t, "ms", ms.Address, 1, msProps...)
	hungDev := plcDevice(t, "hung", hung, 1, prop("count", map[string]any{"register": "holding", "address": 0}))
	garbage := garbagePeer(t, "127.0.0.13")
	garbageDev := plcDevice(t, "garbage", garbage, 1, prop("count", map[string]any{"register": "holding", "address": 0}))
	run := startMapper(t, []*dmiv1beta1.DeviceModel{plcModel}, jsDev, msDev, hungDev, garbageDev)
	agent := run.agent

	want := map[string]string{"count": "1234", "flowBig": "12.375", "flowLittle": "12.375", "signed": "-5", "mode": "10",
		"temperature": "25.5", "pump": "true", "alarm": "false"}
	// discrete input 5 is set in the table, but jsmodbus and modbus-serial
	// both start with what the launcher gave them.
	want["alarm"] = "true"

	t.Run("reads every register type and data type", func(t *testing.T) {
		for _, dev := range []string{"js", "ms"} {
			for prop, v := range want {
				agent.WaitReported(t, "default/"+dev, prop, v, 0, wait)
			}
			agent.WaitState(t, "default/"+dev, "ok", wait)
		}
	})

	t.Run("bad visitors are clear errors and the rest goes on", func(t *testing.T) {
		// Never read, so never reported; GetDevice shows why.
		if e := agent.WaitDeviceError(t, "default", "ms", "past", wait); !strings.Contains(e, "illegal data address") {
			t.Errorf("past the end: %q, want the device's illegal data address", e)
		} else {
			t.Logf("past the end: %s", e)
		}
		if e := agent.WaitDeviceError(t, "default", "ms", "wrong", wait); !strings.Contains(e, "int128") {
			t.Errorf("wrong type: %q", e)
		} else {
			t.Logf("wrong type: %s", e)
		}
		agent.WaitState(t, "default/ms", "ok", wait)
	})

	t.Run("a peer that hangs is unhealthy, the others go on", func(t *testing.T) {
		agent.WaitState(t, "default/hung", "unhealthy", wait)
		if e := agent.WaitDeviceError(t, "default", "hung", "count", wait); !strings.Contains(e, "timeout") {
			t.Errorf("hanging peer: %q, want a timeout", e)
		}
		from := agent.ReportCount()
		mbpollWrite(t, js.Address, 0, "1235", "-t", "4")
		agent.WaitReported(t, "default/js", "count", "1235", from, wait)
	})

	t.Run("a peer that answers garbage is unhealthy, the others go on", func(t *testing.T) {
		agent.WaitState(t, "default/garbage", "unhealthy", wait)
		e := agent.WaitDeviceError(t, "default", "garbage", "count", wait)
		t.Logf("garbage: %s", e)
		from := agent.ReportCount()
		mbpollWrite(t, js.Address, 0, "1236", "-t", "4")
		agent.WaitReported(t, "default/js", "count", "1236", from, wait)
	})

	t.Run("a register changed by mbpoll is reported once", func(t *testing.T) {
		from := agent.ReportCount()
		mbpollWrite(t, js.Address, 0, "777", "-t", "4")
		_, next := agent.WaitReported(t, "default/js", "count", "777", from, wait)
		// Ten collect cycles later it was not reported again.
		time.Sleep(500 * time.Millisecond)
		if tws := agent.Twins("default/js", "count", next); len(tws) != 0 {
			t.Errorf("unchanged register reported %d more times", len(tws))
		}
		// Floats in both word orders as mbpoll writes them (-B: big).
		mbpollWrite(t, js.Address, 1, "-2.5", "-t", "4:float", "-B")
		mbpollWrite(t, js.Address, 3, "99.25", "-t", "4:float")
		agent.WaitReported(t, "default/js", "flowBig", "-2.5", from, wait)
		agent.WaitReported(t, "default/js", "flowLittle", "99.25", from, wait)
	})

	t.Run("desired values are written and read back by mbpoll", func(t *testing.T) {
		client := agent.Mapper(t)
		ctx := context.Background()
		dev := jsDev
		for _, d := range []struct{ prop, value string }{{"count", "321"}, {"flowBig", "6.5"}, {"flowLittle", "-1.25"}, {"pump", "false"}, {"mode", "3"}} {
			dev = mappertest.SetDesired(dev, d.prop, d.value)
		}
		from := agent.ReportCount()
		if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: dev}); err != nil {
			t.Fatal(err)
		}
		for _, prop := range []string{"count", "flowBig", "flowLittle", "pump", "mode"} {
			agent.WaitTwin(t, "default/js", prop, from, wait, func(tw *dmiv1beta1.Twin) bool {
				return tw.GetObservedDesired() != nil && tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError] == ""
			})
		}
		agent.WaitReported(t, "default/js", "count", "321", from, wait)
		if v := mbpollRead(t, js.Address, 0, "-t", "4"); v != "321" {
			t.Errorf("mbpoll reads holding 0 = %s, want 321", v)
		}
		if v := mbpollRead(t, js.Address, 1, "-t", "4:float", "-B"); v != "6.5" && v != "6.500000" {
			t.Errorf("mbpoll reads float (big word order) at 1 = %s, want 6.5", v)
		}
		if v := mbpollRead(t, js.Address, 3, "-t", "4:float"); !strings.HasPrefix(v, "-1.25") {
			t.Errorf("mbpoll reads float (little word order) at 3 = %s, want -1.25", v)
		}
		if v := mbpollRead(t, js.Address, 3, "-t", "0"); v != "0" {
			t.Errorf("mbpoll reads coil 3 = %s, want 0", v)
		}
		// The masked write changed bits 8-11 only: 0x0a50 -> 0x0350.
		if v := mbpollRead(t, js.Address, 6, "-t", "4:hex"); !strings.EqualFold(v, "0x0350") {
			t.Errorf("mbpoll reads holding 6 = %s, want 0x0350", v)
		}
		// Outside the model's maximum: refused, nothing written.
		from = agent.ReportCount()
		dev = mappertest.SetDesired(dev, "count", "1001")
		if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: dev}); err != nil {
			t.Fatal(err)
		}
		tw, _ := agent.WaitTwin(t, "default/js", "count", from, wait, func(tw *dmiv1beta1.Twin) bool {
			return tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError] != ""
		})
		if e := tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError]; !strings.Contains(e, "maximum") || tw.GetObservedDesired().GetValue() != "321" {
			t.Errorf("desired above the maximum: twin %v", tw)
		} else {
			t.Logf("above the maximum: %s", e)
		}
		if v := mbpollRead(t, js.Address, 0, "-t", "4"); v != "321" {
			t.Errorf("holding 0 = %s after a refused desired value, want 321", v)
		}
		// A desired value on an input register is refused by the mapper.
		dev2 := mappertest.SetDesired(msDev, "temperature", "20")
		from = agent.ReportCount()
		if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: dev2}); err != nil {
			t.Fatal(err)
		}
		tw, _ = agent.WaitTwin(t, "default/ms", "temperature", from, wait, func(tw *dmiv1beta1.Twin) bool {
			return tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError] != ""
		})
		t.Logf("desired on a ReadOnly input register: %s", tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError])
	})

	t.Run("server stopped and started: offline, then ok, reads resume", func(t *testing.T) {
		agent.WaitState(t, "default/ms", "ok", wait)
		ms.Stop()
		agent.WaitState(t, "default/ms", "offline", wait)
		from := agent.ReportCount()
		ms.Config["holding"] = map[string]int{"0": 4321}
		ms.Restart(t)
		agent.WaitState(t, "default/ms", "ok", wait)
		agent.WaitReported(t, "default/ms", "count", "4321", from, wait)
	})
}

// TestAdjacentRegistersOneRequest counts the requests that reach jsmodbus
// through a byte-counting relay: three properties on adjacent registers
// cost one request per cycle, not three.
func TestAdjacentRegistersOneRequest(t *testing.T) {
	js := npmpeer.StartModbus(t, "jsmodbus", withMemory(map[string]any{"impl": "jsmodbus", "host": "127.0.0.14"}))
	relay := newRelay(t, js.Address)
	dev := plcDevice(t, "adj", relay.addr, 1,
		prop("count", map[string]any{"address": 0}),
		prop("flowBig", map[string]any{"address": 1, "dataType": "float32"}),
		prop("flowLittle", map[string]any{"address": 3, "dataType": "float32", "wordOrder": "little"}))
	run := startMapper(t, []*dmiv1beta1.DeviceModel{plcModel}, dev)
	run.agent.WaitReported(t, "default/adj", "flowLittle", "12.375", 0, wait)
	time.Sleep(300 * time.Millisecond)
	reads := run.metrics.Value("dowse_mapper_reads_total", `result="ok"`)
	requests := float64(relay.requests.Load())
	t.Logf("%v property reads took %v requests", reads, requests)
	if requests*3 > reads+3 || requests*3 < reads-3 {
		t.Errorf("%v reads of 3 adjacent properties took %v requests, want one per 3 reads", reads, requests)
	}
}

// relay forwards TCP connections to a Modbus server and counts the
// requests (MBAP frames) going to it.
type relay struct {
	addr     string
	requests atomic.Int64
}

func newRelay(t *testing.T, target string) *relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: l.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, s); c.Close() })
			wg.Go(func() {
				defer s.Close()
				hdr := make([]byte, 6)
				for {
					if _, err := io.ReadFull(c, hdr); err != nil {
						return
					}
					body := make([]byte, binary.BigEndian.Uint16(hdr[4:]))
					if _, err := io.ReadFull(c, body); err != nil {
						return
					}
					r.requests.Add(1)
					if _, err := s.Write(append(hdr, body...)); err != nil {
						return
					}
				}
			})
		}
	})
	return r
}

// hangingPeer accepts TCP connections and never answers: a device that
// hangs.
func hangingPeer(t *testing.T, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return l.Addr().String()
}

// garbagePeer accepts TCP connections and answers every request with an
// HTTP error page: a device that answers garbage.
func garbagePeer(t *testing.T, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				buf := make([]byte, 512)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					if _, err := c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}
