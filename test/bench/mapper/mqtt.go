package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

// runMQTT measures the MQTT sink: dowse-modbus-mapper reading nDevices
// devices of nProps properties on adjacent holding registers of one
// jsmodbus server (one request a device a cycle), collect cycle 100 ms,
// the registers counting up every 10 ms so every reading changes and is
// pushed, each property published at QoS 1 to its own topic on Debian's
// mosquitto, received by mosquitto_sub (QoS 1). It prints the messages a
// second mosquitto_sub received, the mapper's CPU, what was lost
// (readings acknowledged by the broker and never received, and readings
// dropped from the buffer) and the mapper's peak RSS.
func runMQTT(ctx context.Context, root string, window time.Duration, nDevices, nProps int) error {
	mosq, err := exec.LookPath("mosquitto")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/mosquitto"); serr != nil {
			return errors.New("mosquitto is missing: run hack/install-deps.sh (Debian mosquitto, mosquitto-clients)")
		}
		mosq = "/usr/sbin/mosquitto"
	}
	subBin, err := exec.LookPath("mosquitto_sub")
	if err != nil {
		return errors.New("mosquitto_sub is missing: run hack/install-deps.sh (Debian mosquitto-clients)")
	}
	modules, err := jsmodbusModules(root)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "dowse-mq")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	port, err := procs.FreePort()
	if err != nil {
		return err
	}
	js, err := startJSModbusWith(root, modules, port, map[string]any{"tick": map[string]int{"ms": 10, "words": nProps}})
	if err != nil {
		return err
	}
	defer js.stop()
	address := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	// The broker: no per-client queue limit, so a slow subscriber never
	// makes it drop what the mapper delivered.
	bport, err := procs.FreePort()
	if err != nil {
		return err
	}
	conf := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\nmax_inflight_messages 0\n", bport)
	if os.Geteuid() == 0 {
		conf += "user root\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "mosquitto.conf"), []byte(conf), 0o600); err != nil {
		return err
	}
	blog, err := os.Create(filepath.Join(dir, "mosquitto.log"))
	if err != nil {
		return err
	}
	defer blog.Close()
	broker := exec.Command(mosq, "-c", filepath.Join(dir, "mosquitto.conf"))
	broker.Stdout, broker.Stderr = blog, blog
	if err := broker.Start(); err != nil {
		return err
	}
	defer func() { _ = broker.Process.Signal(syscall.SIGTERM); _ = broker.Wait() }()
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(bport)))
		if err == nil {
			c.Close()
			break
		}
		if i == 500 {
			return fmt.Errorf("mosquitto did not listen: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	brokerURL := "tcp://127.0.0.1:" + strconv.Itoa(bport)

	// mosquitto_sub, its output line-buffered (stdbuf) so that -d's
	// "Subscribed" says when it is ready.
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(bport), "-t", "bench/#", "-q", "1", "-d"}
	sub := exec.Command(subBin, args...)
	if sb, err := exec.LookPath("stdbuf"); err == nil {
		sub = exec.Command(sb, append([]string{"-oL", subBin}, args...)...)
	}
	out, err := sub.StdoutPipe()
	if err != nil {
		return err
	}
	if err := sub.Start(); err != nil {
		return err
	}
	defer func() { _ = sub.Process.Kill(); _ = sub.Wait() }()
	var received atomic.Int64
	subscribed := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		ready := false
		for sc.Scan() {
			l := sc.Text()
			if strings.HasPrefix(l, "Client ") || strings.HasPrefix(l, "Subscribed (mid") {
				if !ready && strings.HasPrefix(l, "Subscribed (mid") {
					ready = true
					close(subscribed)
				}
				continue
			}
			if strings.HasPrefix(l, `{"namespace":"bench"`) {
				received.Add(1)
			}
		}
	}()
	select {
	case <-subscribed:
	case <-time.After(15 * time.Second):
		return errors.New("mosquitto_sub did not subscribe within 15s")
	}

	agent := mappertest.NewAgent(filepath.Join(dir, "dmi", "dmi.sock"))
	if err := agent.Listen(); err != nil {
		return err
	}
	defer agent.Close()
	m, metrics, stopMapper, err := startMapper(dir, "dowse-modbus-mapper")
	if err != nil {
		return err
	}
	defer stopMapper()
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
	if _, err := client.CreateDeviceModel(ctx, &dmiv1beta1.CreateDeviceModelRequest{Model: mappertest.NewModel("bench", "bench", mprops...)}); err != nil {
		return err
	}
	var names []string
	for d := range nDevices {
		name := "d" + strconv.Itoa(d)
		var ps []mappertest.Prop
		for i := range nProps {
			ps = append(ps, mappertest.Prop{Name: "p" + strconv.Itoa(i), CollectCycle: 100 * time.Millisecond,
				Visitor: map[string]any{"register": "holding", "address": i},
				PushMethod: &dmiv1beta1.PushMethod{Mqtt: &dmiv1beta1.PushMethodMQTT{Address: brokerURL,
					Topic: "bench/" + name + "/p" + strconv.Itoa(i), Qos: 1}}})
		}
		dev, err := mappertest.MakeDevice("bench", name, "bench", "modbus", map[string]any{"address": address, "unitId": 1 + d%247, "timeout": "2s"}, ps...)
		if err != nil {
			return err
		}
		if _, err := client.RegisterDevice(ctx, &dmiv1beta1.RegisterDeviceRequest{Device: dev}); err != nil {
			return err
		}
		names = append(names, name)
	}
	time.Sleep(2 * time.Second) // connect and settle
	labels := `kind="mqtt",address="` + brokerURL + `"`
	r0 := received.Load()
	s0, _ := counter(metrics, `dowse_mapper_sink_sent_total{`+labels+`}`)
	cpu0, _ := procs.CPUSeconds(m.Pid())
	busy0, total0, _ := procs.MachineCPU()
	start := time.Now()
	select {
	case <-time.After(window):
	case <-ctx.Done():
		return ctx.Err()
	}
	r1 := received.Load()
	s1, _ := counter(metrics, `dowse_mapper_sink_sent_total{`+labels+`}`)
	cpu1, _ := procs.CPUSeconds(m.Pid())
	busy1, total1, _ := procs.MachineCPU()
	took := time.Since(start).Seconds()
	reads, _ := counter(metrics, `dowse_mapper_reads_total{result="ok"}`)
	for _, n := range names {
		if _, err := client.RemoveDevice(ctx, &dmiv1beta1.RemoveDeviceRequest{DeviceName: n, DeviceNamespace: "bench"}); err != nil {
			return err
		}
	}
	// Wait for the last deliveries to reach mosquitto_sub.
	last, stable := received.Load(), 0
	for stable < 10 {
		time.Sleep(100 * time.Millisecond)
		if n := received.Load(); n == last {
			stable++
		} else {
			last, stable = n, 0
		}
	}
	sent, _ := counter(metrics, `dowse_mapper_sink_sent_total{`+labels+`}`)
	dropped, _ := counter(metrics, `dowse_mapper_sink_dropped_total{`+labels+`}`)
	errs, _ := counter(metrics, `dowse_mapper_sink_errors_total{`+labels+`}`)
	kib, _ := m.PeakRSS()
	load := "?"
	if total1 > total0 {
		load = fmt.Sprintf("%.0f%%", 100*float64(busy1-busy0)/float64(total1-total0))
	}
	fmt.Printf("MQTT sink, %d devices x %d properties at a 100 ms cycle (registers changing every 10 ms), QoS 1 to mosquitto, one connection:\n", nDevices, nProps)
	fmt.Printf("  received by mosquitto_sub %.0f messages/s (the mapper delivered %.0f/s) on %.2f cores of the mapper (machine busy %s; goal >= 10000/s on < 0.5 core)\n",
		float64(r1-r0)/took, (s1-s0)/took, (cpu1-cpu0)/took, load)
	fmt.Printf("  over the run: %.0f reads, %.0f delivered (broker acknowledged), %d received, lost %.0f, dropped from the buffer %.0f, sink errors %.0f (goal 0 lost)\n",
		reads, sent, last, max(0, sent-float64(last)), dropped, errs)
	fmt.Printf("  mapper peak RSS (VmHWM) with the MQTT sink on, %d devices: %.1f MiB (goal < 20 MiB)\n", nDevices, float64(kib)/1024)
	return nil
}
