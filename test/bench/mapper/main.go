// Command mapper benchmarks the Modbus mapper: the real binary
// (bin/dowse-modbus-mapper, from `make build`) against a real jsmodbus
// server on loopback, registered with a fake agent (mappers/mapper/
// mappertest) in this process. It prints:
//   - property reads a second on one device and across 100 devices (one
//     jsmodbus server, one unit id per device), every property on its own
//     register (one request each), collect cycle 1 ms: the mapper's ceiling;
//     and 100 devices at a 1 s cycle, with the peak anonymous memory of
//     each phase (the 1 s phase first: Go keeps freed heap a while);
//   - desired write -> register changed, p50 and p99: from the UpdateDevice
//     call to jsmodbus's own report of the write;
//   - device change -> report sent, p50 and p99: from a register written by
//     another client to the ReportDeviceStatus carrying it, collect cycle
//     10 ms (-latency-cycle; half a cycle is the expected wait);
//   - the mapper's peak RSS (VmHWM).
//
// Then the same for dowse-opcua-mapper against node-opcua's conformance
// server (opcua.go), with the pushed (subscribed) change -> report latency,
// and dowse-onvif-mapper's read rate against go2rtc (onvif.go).
//
// jsmodbus comes from the npm registry into bin/npm-peers/modbus, as the
// tests install it; node-opcua from bin/npm-peers/opcua.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goburrow/modbus"

	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

var (
	latCycle  time.Duration
	mapperLog string
)

func main() {
	window := flag.Duration("window", 5*time.Second, "measurement window of each read-rate figure")
	devices := flag.Int("devices", 100, "devices of the many-device read rate")
	props := flag.Int("properties", 10, "properties per device")
	samples := flag.Int("samples", 200, "samples of each latency figure")
	withOPCUA := flag.Bool("opcua", true, "also measure dowse-opcua-mapper against node-opcua")
	withONVIF := flag.Bool("onvif", true, "also measure dowse-onvif-mapper against go2rtc")
	withModbus := flag.Bool("modbus", true, "measure dowse-modbus-mapper's reads and latencies against jsmodbus")
	withMQTT := flag.Bool("mqtt", true, "also measure dowse-modbus-mapper's MQTT sink (pushMethod) into mosquitto")
	flag.DurationVar(&latCycle, "latency-cycle", 10*time.Millisecond, "collect cycle of the latency device")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if *withModbus {
		err = run(ctx, *window, *devices, *props, *samples)
	}
	root, _ := repoRoot()
	if err == nil && *withMQTT {
		err = runMQTT(ctx, root, *window, *devices, *props)
	}
	if err == nil && *withOPCUA {
		err = runOPCUA(ctx, root, *window, *samples)
	}
	if err == nil && *withONVIF {
		err = runONVIF(ctx, root, *window)
	}
	if err != nil {
		if b, rerr := os.ReadFile(mapperLog); rerr == nil {
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			fmt.Fprintln(os.Stderr, "mapper log, last lines:")
			for _, l := range lines[max(0, len(lines)-20):] {
				fmt.Fprintln(os.Stderr, "  "+l)
			}
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// jsmodbusModules installs jsmodbus where the tests keep it, once.
func jsmodbusModules(root string) (string, error) {
	dir := filepath.Join(root, "bin", "npm-peers", "modbus")
	modules := filepath.Join(dir, "node_modules")
	if b, err := os.ReadFile(filepath.Join(modules, "jsmodbus", "package.json")); err == nil {
		var meta struct{ Version string }
		if json.Unmarshal(b, &meta) == nil && meta.Version == "5.0.0" {
			return modules, nil
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, "package.json")); err != nil {
		if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"name":"dowse-npm-peers","private":true}`+"\n"), 0o644); err != nil {
			return "", err
		}
	}
	cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--omit=optional", "jsmodbus@5.0.0", "modbus-serial@8.0.25")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm install jsmodbus@5.0.0 (needs node and npm: apt-get install -y nodejs npm): %w\n%s", err, out)
	}
	return modules, nil
}

type peer struct {
	cmd    *exec.Cmd
	writes chan string
	ready  chan struct{}
	done   chan struct{}
}

func startJSModbus(root, modules string, port int) (*peer, error) {
	return startJSModbusWith(root, modules, port, nil)
}

// startJSModbusWith is startJSModbus with more of the launcher's settings.
func startJSModbusWith(root, modules string, port int, extra map[string]any) (*peer, error) {
	c := map[string]any{"impl": "jsmodbus", "host": "127.0.0.1", "port": port, "size": 4096, "logWrites": true}
	for k, v := range extra {
		c[k] = v
	}
	cfg, _ := json.Marshal(c)
	cmd := exec.Command("node", npmpeer.ModbusScript(), string(cfg))
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("node (apt-get install -y nodejs): %w", err)
	}
	p := &peer{cmd: cmd, writes: make(chan string, 1024), ready: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "READY"):
				close(p.ready)
			case strings.HasPrefix(line, "WRITE "):
				select {
				case p.writes <- strings.TrimPrefix(line, "WRITE "):
				default:
				}
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case <-p.ready:
		return p, nil
	case <-p.done:
		return nil, errors.New("jsmodbus exited before it listened")
	case <-time.After(15 * time.Second):
		p.stop()
		return nil, errors.New("jsmodbus did not listen within 15s")
	}
}

func (p *peer) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// startMapper runs the mapper binary with the fake agent's socket in dir,
// its metrics on a free loopback port and its log in dir/mapper.log; stop
// ends it and closes the log.
func startMapper(dir, binary string) (m *procs.Proc, metrics string, stop func(), err error) {
	mport, err := procs.FreePort()
	if err != nil {
		return nil, "", nil, err
	}
	mapperLog = filepath.Join(dir, "mapper.log")
	logf, err := os.Create(mapperLog)
	if err != nil {
		return nil, "", nil, err
	}
	m, err = procs.Start(binary, logf, "--state-dir="+dir, "--metrics-address=127.0.0.1:"+strconv.Itoa(mport))
	if err != nil {
		logf.Close()
		return nil, "", nil, err
	}
	return m, "http://127.0.0.1:" + strconv.Itoa(mport) + "/metrics", func() { m.Stop(); logf.Close() }, nil
}

// awaitRegistration waits until mapper m has registered with agent.
func awaitRegistration(agent *mappertest.Agent, m *procs.Proc) error {
	deadline := time.Now().Add(15 * time.Second)
	for agent.Registrations() == 0 {
		if time.Now().After(deadline) || m.Exited() {
			return fmt.Errorf("%s did not register (log: %s)", m.Name, mapperLog)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// counter reads one counter from the mapper's /metrics.
func counter(url, series string) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, nil
}

func run(ctx context.Context, window time.Duration, nDevices, nProps, samples int) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(procs.BinDir(), "dowse-modbus-mapper")); err != nil {
		return fmt.Errorf("bin/dowse-modbus-mapper is missing: run make build")
	}
	modules, err := jsmodbusModules(root)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "dowse-mb")
	if err != nil {
		return err
	}
	defer func() {
		if os.Getenv("BENCH_KEEP") == "" {
			os.RemoveAll(dir)
		}
	}()

	port, err := procs.FreePort()
	if err != nil {
		return err
	}
	js, err := startJSModbus(root, modules, port)
	if err != nil {
		return err
	}
	defer js.stop()
	address := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	reports := make(chan mappertest.Report, 4096)
	agent := mappertest.NewAgent(filepath.Join(dir, "dmi", "dmi.sock"))
	agent.OnReport = func(r mappertest.Report) {
		if r.Req.GetDeviceName() == "lat" {
			select {
			case reports <- r:
			default:
			}
		}
	}
	if err := agent.Listen(); err != nil {
		return err
	}
	defer agent.Close()

	m, metrics, stopMapper, err := startMapper(dir, "dowse-modbus-mapper")
	if err != nil {
		return err
	}
	defer stopMapper()
	// Sample memory all along: the kernel keeps only the peak of the total
	// (VmHWM), not of its anonymous part.
	var peakAnon, phaseAnon atomic.Int64
	sampled := make(chan struct{})
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go func() {
		defer close(sampled)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case <-t.C:
				if mem, err := m.MemoryNow(); err == nil {
					a := int64(mem.Anon)
					if a > peakAnon.Load() {
						peakAnon.Store(a)
					}
					if a > phaseAnon.Load() {
						phaseAnon.Store(a)
					}
				}
			}
		}
	}()
	fmt.Printf("jsmodbus on %s (pid %d), dowse-modbus-mapper pid %d\n", address, js.cmd.Process.Pid, m.Pid())

	if err := awaitRegistration(agent, m); err != nil {
		return err
	}
	client, err := agent.MapperClient()
	if err != nil {
		return err
	}
	var mprops []*dmiv1beta1.ModelProperty
	for i := range nProps {
		mprops = append(mprops, mappertest.ModelProp("p"+strconv.Itoa(i), "INT", "ReadOnly", "", ""))
	}
	mprops = append(mprops, mappertest.ModelProp("w", "INT", "ReadWrite", "0", "65535"), mappertest.ModelProp("c", "INT", "ReadOnly", "", ""))
	model := mappertest.NewModel("bench", "bench", mprops...)
	if _, err := client.CreateDeviceModel(ctx, &dmiv1beta1.CreateDeviceModelRequest{Model: model}); err != nil {
		return err
	}

	device := func(name string, unit int, cycle time.Duration) (*dmiv1beta1.Device, error) {
		var ps []mappertest.Prop
		for i := range nProps {
			// Every other register: no two properties share a request.
			ps = append(ps, mappertest.Prop{Name: "p" + strconv.Itoa(i), CollectCycle: cycle,
				Visitor: map[string]any{"register": "holding", "address": 2 * i}})
		}
		return mappertest.MakeDevice("bench", name, "bench", "modbus", map[string]any{"address": address, "unitId": unit, "timeout": "2s"}, ps...)
	}
	readRate := func(n int, cycle time.Duration) (float64, float64, error) {
		var devs []*dmiv1beta1.Device
		phaseAnon.Store(0)
		for i := range n {
			d, err := device("d"+strconv.Itoa(i), 1+i%247, cycle)
			if err != nil {
				return 0, 0, err
			}
			if _, err := client.RegisterDevice(ctx, &dmiv1beta1.RegisterDeviceRequest{Device: d}); err != nil {
				return 0, 0, err
			}
			devs = append(devs, d)
		}
		time.Sleep(time.Second) // connect and settle
		ok0, _ := counter(metrics, `dowse_mapper_reads_total{result="ok"}`)
		err0, _ := counter(metrics, `dowse_mapper_reads_total{result="error"}`)
		cpu0, _ := procs.CPUSeconds(m.Pid())
		start := time.Now()
		select {
		case <-time.After(window):
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
		ok1, err := counter(metrics, `dowse_mapper_reads_total{result="ok"}`)
		if err != nil {
			return 0, 0, err
		}
		err1, _ := counter(metrics, `dowse_mapper_reads_total{result="error"}`)
		took := time.Since(start).Seconds()
		if cpu1, err := procs.CPUSeconds(m.Pid()); err == nil && ok1 > ok0 {
			// What a read costs the mapper, whatever share of the cores it
			// got on a busy machine.
			fmt.Printf("  (mapper CPU %.2f s in %.1f s: %.0f µs a read)\n", cpu1-cpu0, took, (cpu1-cpu0)/(ok1-ok0)*1e6)
		}
		heap, _ := counter(metrics, "go_memstats_heap_inuse_bytes")
		stack, _ := counter(metrics, "go_memstats_stack_inuse_bytes")
		sys, _ := counter(metrics, "go_memstats_sys_bytes")
		fmt.Printf("  (Go heap in use %.1f MiB, stacks %.1f MiB, obtained from the OS %.1f MiB)\n", heap/(1<<20), stack/(1<<20), sys/(1<<20))
		for _, d := range devs {
			if _, err := client.RemoveDevice(ctx, &dmiv1beta1.RemoveDeviceRequest{DeviceName: d.GetName(), DeviceNamespace: d.GetNamespace()}); err != nil {
				return 0, 0, err
			}
		}
		time.Sleep(500 * time.Millisecond)
		return (ok1 - ok0) / took, (err1 - err0) / took, nil
	}

	one, oneErr, err := readRate(1, time.Millisecond)
	if err != nil {
		return err
	}
	fmt.Printf("reads/s, one device (%d properties, one request each, collect cycle 1 ms): %.0f (errors/s %.0f)\n", nProps, one, oneErr)
	steady, steadyErr, err := readRate(nDevices, time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("reads/s, %d devices at a 1 s collect cycle (%d properties each): %.0f (errors/s %.0f); peak anonymous memory %.1f MiB\n",
		nDevices, nProps, steady, steadyErr, float64(phaseAnon.Load())/1024)
	many, manyErr, err := readRate(nDevices, time.Millisecond)
	if err != nil {
		return err
	}
	fmt.Printf("reads/s, %d devices on one jsmodbus server (%d properties each, one request each, collect cycle 1 ms): %.0f (errors/s %.0f); peak anonymous memory %.1f MiB\n",
		nDevices, nProps, many, manyErr, float64(phaseAnon.Load())/1024)

	// Latencies on one device: w (holding 9000, written), c (holding
	// 9001, changed by another client), both read every 10 ms.
	lat, err := mappertest.MakeDevice("bench", "lat", "bench", "modbus", map[string]any{"address": address, "unitId": 1, "timeout": "2s"},
		mappertest.Prop{Name: "w", CollectCycle: latCycle, Visitor: map[string]any{"address": 9000 % 4096}},
		mappertest.Prop{Name: "c", CollectCycle: latCycle, Visitor: map[string]any{"address": 9001 % 4096}})
	if err != nil {
		return err
	}
	if _, err := client.RegisterDevice(ctx, &dmiv1beta1.RegisterDeviceRequest{Device: lat}); err != nil {
		return err
	}
	waitReport := func(prop, value string, timeout time.Duration) (time.Time, error) {
		t := time.NewTimer(timeout)
		defer t.Stop()
		for {
			select {
			case r := <-reports:
				for _, tw := range r.Req.GetReportedDevice().GetTwins() {
					if tw.GetPropertyName() == prop && tw.GetReported().GetValue() == value {
						return r.At, nil
					}
				}
			case <-t.C:
				return time.Time{}, fmt.Errorf("no report of %s = %s within %v", prop, value, timeout)
			}
		}
	}
	if _, err := waitReport("c", "0", 10*time.Second); err != nil {
		return err
	}

	var writeLat []time.Duration
	wait0, _ := buckets(metrics, "dowse_mapper_desired_wait_seconds")
	took0, _ := buckets(metrics, "dowse_mapper_write_duration_seconds")
	for i := range samples {
		v := strconv.Itoa(1000 + i)
		dev := mappertest.SetDesired(lat, "w", v)
		start := time.Now()
		if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: dev}); err != nil {
			return err
		}
		timeout := time.After(5 * time.Second)
	wait:
		for {
			select {
			case w := <-js.writes:
				if w == strconv.Itoa(9000%4096)+" "+v {
					writeLat = append(writeLat, time.Since(start))
					break wait
				}
			case <-timeout:
				return fmt.Errorf("register not written with %s within 5s", v)
			}
		}
	}
	p50, p99 := pct(writeLat)
	fmt.Printf("desired write -> register changed (UpdateDevice to jsmodbus's write), %d samples: p50 %v p99 %v (goal p99 < 50ms)\n", len(writeLat), p50, p99)
	// The mapper's own share: desired value in -> write started (its
	// queueing), and the write exchange with jsmodbus.
	if wait1, err := buckets(metrics, "dowse_mapper_desired_wait_seconds"); err == nil {
		took1, _ := buckets(metrics, "dowse_mapper_write_duration_seconds")
		fmt.Printf("  (in the mapper: desired value in -> write started p50 <= %s p99 <= %s; write exchange with jsmodbus p50 <= %s p99 <= %s)\n",
			quantile(wait0, wait1, 0.5), quantile(wait0, wait1, 0.99), quantile(took0, took1, 0.5), quantile(took0, took1, 0.99))
	}

	h := modbus.NewTCPClientHandler(address)
	h.SlaveId = 1
	h.Timeout = 2 * time.Second
	if err := h.Connect(); err != nil {
		return err
	}
	defer h.Close()
	other := modbus.NewClient(h)
	var changeLat []time.Duration
	for i := range samples {
		v := 2000 + i
		// A random pause: writing right after the last report would land
		// just after a read every time and measure a full cycle.
		time.Sleep(rand.N(latCycle))
		// Drain reports of earlier values.
		for len(reports) > 0 {
			<-reports
		}
		if _, err := other.WriteSingleRegister(uint16(9001%4096), uint16(v)); err != nil {
			return err
		}
		changed := time.Now()
		at, err := waitReport("c", strconv.Itoa(v), 5*time.Second)
		if err != nil {
			return err
		}
		changeLat = append(changeLat, at.Sub(changed))
	}
	p50, p99 = pct(changeLat)
	fmt.Printf("device change -> report sent (register written by another client to ReportDeviceStatus received), collect cycle %v, %d samples: p50 %v p99 %v\n", latCycle, len(changeLat), p50, p99)

	stopSampling()
	<-sampled
	kib, err := m.PeakRSS()
	if err != nil {
		return err
	}
	now, _ := m.MemoryNow()
	fmt.Printf("mapper peak RSS (VmHWM) over the run, %d devices at most: %.1f MiB (peak anonymous %.1f MiB; now %.1f MiB of which %.1f MiB file-backed binary pages; goal < 16 MiB)\n",
		nDevices, float64(kib)/1024, float64(peakAnon.Load())/1024, float64(now.RSS)/1024, float64(now.File)/1024)
	return nil
}

// bucket is one cumulative histogram bucket.
type bucket struct {
	le    string
	count float64
}

// buckets reads a histogram's cumulative buckets from the mapper's /metrics.
func buckets(url, name string) ([]bucket, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var out []bucket
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, name+`_bucket{le="`)
		if !ok {
			continue
		}
		le, v, _ := strings.Cut(rest, `"} `)
		n, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
		out = append(out, bucket{le: le, count: n})
	}
	return out, nil
}

// quantile is the upper bound of the bucket holding quantile q of the
// observations between two readings of a histogram.
func quantile(before, after []bucket, q float64) string {
	if len(after) == 0 {
		return "?"
	}
	base := func(i int) float64 {
		if i < len(before) {
			return before[i].count
		}
		return 0
	}
	total := after[len(after)-1].count - base(len(after)-1)
	if total == 0 {
		return "-"
	}
	for i, b := range after {
		if b.count-base(i) >= q*total {
			if f, err := strconv.ParseFloat(b.le, 64); err == nil {
				return time.Duration(f * float64(time.Second)).String()
			}
			return b.le
		}
	}
	return "+Inf"
}

func pct(d []time.Duration) (time.Duration, time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) time.Duration {
		return s[min(len(s)-1, int(q*float64(len(s))))].Round(10 * time.Microsecond)
	}
	return at(0.50), at(0.99)
}
