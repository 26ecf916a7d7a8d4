package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// startNodeOPCUA runs node-opcua's conformance server (the launcher of the
// OPC UA handler's tests) from bin/npm-peers/opcua, as the tests install it.
func startNodeOPCUA(root, dir string, port int) (*peer, error) {
	modules := filepath.Join(root, "bin", "npm-peers", "opcua", "node_modules")
	if _, err := os.Stat(filepath.Join(modules, "node-opcua-address-space-for-conformance-testing")); err != nil {
		return nil, fmt.Errorf("node-opcua is not installed in %s: run go test ./mappers/opcua once (it installs node-opcua@2.182.2)", modules)
	}
	cfg, _ := json.Marshal(map[string]any{"kind": "server", "port": port, "pkiDir": filepath.Join(dir, "pki"),
		"applicationName": "bench", "applicationUri": "urn:dowse:bench"})
	cmd := exec.Command("node", npmpeer.OPCUAScript(), string(cfg))
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &peer{cmd: cmd, ready: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY") {
				close(p.ready)
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case <-p.ready:
		return p, nil
	case <-p.done:
		return nil, errors.New("node-opcua exited before it listened")
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGTERM)
		return nil, errors.New("node-opcua did not listen within 90s")
	}
}

// runOPCUA measures dowse-opcua-mapper against node-opcua: reads a second
// of one device polling 10 nodes at a 1 ms cycle (one Read request per
// cycle), desired value -> the write acknowledged and reported, a node
// changed by another client -> the pushed value reported (subscription,
// 10 ms publishing interval), and peak RSS.
func runOPCUA(ctx context.Context, root string, window time.Duration, samples int) error {
	if _, err := os.Stat(filepath.Join(procs.BinDir(), "dowse-opcua-mapper")); err != nil {
		return fmt.Errorf("bin/dowse-opcua-mapper is missing: run make build")
	}
	dir, err := os.MkdirTemp("", "dowse-ob")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	port, err := procs.FreePort()
	if err != nil {
		return err
	}
	srv, err := startNodeOPCUA(root, dir, port)
	if err != nil {
		return err
	}
	defer srv.stop()
	endpoint := "opc.tcp://127.0.0.1:" + strconv.Itoa(port)

	reports := make(chan mappertest.Report, 4096)
	agent := mappertest.NewAgent(filepath.Join(dir, "dmi", "dmi.sock"))
	agent.OnReport = func(r mappertest.Report) {
		select {
		case reports <- r:
		default:
		}
	}
	if err := agent.Listen(); err != nil {
		return err
	}
	defer agent.Close()
	m, metrics, stopMapper, err := startMapper(dir, "dowse-opcua-mapper")
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
	nodes := []string{"Static_Scalar_Int16", "Static_Scalar_Int32", "Static_Scalar_Int64", "Static_Scalar_UInt16", "Static_Scalar_UInt32",
		"Static_Scalar_Float", "Static_Scalar_Double", "Static_Scalar_Byte", "Static_Scalar_SByte", "Static_Scalar_Boolean"}
	var mprops []*dmiv1beta1.ModelProperty
	var props []mappertest.Prop
	for i, n := range nodes {
		typ := "DOUBLE"
		if n == "Static_Scalar_Boolean" {
			typ = "BOOLEAN"
		}
		mprops = append(mprops, mappertest.ModelProp("n"+strconv.Itoa(i), typ, "ReadOnly", "", ""))
		props = append(props, mappertest.Prop{Name: "n" + strconv.Itoa(i), CollectCycle: time.Millisecond, Visitor: map[string]any{"nodeId": "ns=2;s=" + n}})
	}
	mprops = append(mprops, mappertest.ModelProp("w", "INT", "ReadWrite", "", ""), mappertest.ModelProp("c", "DOUBLE", "ReadOnly", "", ""))
	model := mappertest.NewModel("bench", "bench", mprops...)
	if _, err := client.CreateDeviceModel(ctx, &dmiv1beta1.CreateDeviceModelRequest{Model: model}); err != nil {
		return err
	}
	cfg := map[string]any{"endpoint": endpoint, "timeout": "5s", "publishingInterval": "10ms"}
	poll, err := mappertest.MakeDevice("bench", "poll", "bench", "opcua", cfg, props...)
	if err != nil {
		return err
	}
	if _, err := client.RegisterDevice(ctx, &dmiv1beta1.RegisterDeviceRequest{Device: poll}); err != nil {
		return err
	}
	// Measure once the session is up and values flow.
	deadline := time.Now().Add(60 * time.Second)
	for len(agent.Twins("bench/poll", "n0", 0)) == 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("the polled OPC UA device never reported (log: %s)", mapperLog)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ok0, _ := counter(metrics, `dowse_mapper_reads_total{result="ok"}`)
	start := time.Now()
	time.Sleep(window)
	ok1, _ := counter(metrics, `dowse_mapper_reads_total{result="ok"}`)
	fmt.Printf("OPC UA reads/s, one device (%d nodes in one Read request per cycle, collect cycle 1 ms): %.0f\n", len(nodes), (ok1-ok0)/time.Since(start).Seconds())
	if _, err := client.RemoveDevice(ctx, &dmiv1beta1.RemoveDeviceRequest{DeviceName: "poll", DeviceNamespace: "bench"}); err != nil {
		return err
	}

	lat, err := mappertest.MakeDevice("bench", "lat", "bench", "opcua", cfg,
		mappertest.Prop{Name: "w", CollectCycle: time.Second, Visitor: map[string]any{"nodeId": "ns=2;s=Static_Scalar_Int32"}},
		mappertest.Prop{Name: "c", Visitor: map[string]any{"nodeId": "ns=2;s=Static_Scalar_Double", "subscribe": true, "samplingInterval": "1ms"}})
	if err != nil {
		return err
	}
	if _, err := client.RegisterDevice(ctx, &dmiv1beta1.RegisterDeviceRequest{Device: lat}); err != nil {
		return err
	}
	waitTwin := func(ok func(*dmiv1beta1.Twin) bool, timeout time.Duration) (time.Time, error) {
		t := time.NewTimer(timeout)
		defer t.Stop()
		for {
			select {
			case r := <-reports:
				if r.Req.GetDeviceName() != "lat" {
					continue
				}
				for _, tw := range r.Req.GetReportedDevice().GetTwins() {
					if ok(tw) {
						return r.At, nil
					}
				}
			case <-t.C:
				return time.Time{}, errors.New("no such report within the timeout")
			}
		}
	}
	if _, err := waitTwin(func(tw *dmiv1beta1.Twin) bool { return tw.GetPropertyName() == "c" }, 30*time.Second); err != nil {
		return fmt.Errorf("the subscribed node was never reported: %w", err)
	}
	var writeLat []time.Duration
	for i := range samples {
		v := strconv.Itoa(5000 + i)
		for len(reports) > 0 {
			<-reports
		}
		start := time.Now()
		if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: mappertest.SetDesired(lat, "w", v)}); err != nil {
			return err
		}
		at, err := waitTwin(func(tw *dmiv1beta1.Twin) bool {
			return tw.GetPropertyName() == "w" && tw.GetObservedDesired().GetValue() == v
		}, 5*time.Second)
		if err != nil {
			return fmt.Errorf("desired %s: %w", v, err)
		}
		writeLat = append(writeLat, at.Sub(start))
	}
	p50, p99 := pct(writeLat)
	fmt.Printf("OPC UA desired write -> written and reported (UpdateDevice to the report of the write the server acknowledged), %d samples: p50 %v p99 %v\n", len(writeLat), p50, p99)

	other, err := otherOPCUAClient(ctx, endpoint)
	if err != nil {
		return err
	}
	defer other.Close(context.WithoutCancel(ctx))
	var changeLat []time.Duration
	for i := range samples {
		v := 100.5 + float64(i)
		for len(reports) > 0 {
			<-reports
		}
		resp, err := other.Write(ctx, &ua.WriteRequest{NodesToWrite: []*ua.WriteValue{{NodeID: ua.MustParseNodeID("ns=2;s=Static_Scalar_Double"),
			AttributeID: ua.AttributeIDValue, Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: ua.MustVariant(v)}}}})
		if err != nil || resp.Results[0] != ua.StatusOK {
			return fmt.Errorf("writing with another client: %w %v", err, resp)
		}
		changed := time.Now()
		want := strconv.FormatFloat(v, 'g', -1, 64)
		at, err := waitTwin(func(tw *dmiv1beta1.Twin) bool {
			return tw.GetPropertyName() == "c" && tw.GetReported().GetValue() == want
		}, 5*time.Second)
		if err != nil {
			return fmt.Errorf("pushed %s: %w", want, err)
		}
		changeLat = append(changeLat, at.Sub(changed))
	}
	p50, p99 = pct(changeLat)
	fmt.Printf("OPC UA node changed by another client -> report sent (subscription, 10 ms publishing, no polling), %d samples: p50 %v p99 %v\n", len(changeLat), p50, p99)
	kib, err := m.PeakRSS()
	if err != nil {
		return err
	}
	now, _ := m.MemoryNow()
	fmt.Printf("OPC UA mapper peak RSS (VmHWM): %.1f MiB (now %.1f MiB, %.1f MiB anonymous)\n", float64(kib)/1024, float64(now.RSS)/1024, float64(now.Anon)/1024)
	return nil
}

func otherOPCUAClient(ctx context.Context, endpoint string) (*opcua.Client, error) {
	eps, err := opcua.GetEndpoints(ctx, endpoint)
	if err != nil {
		return nil, err
	}
	ep, err := opcua.SelectEndpoint(eps, "None", ua.MessageSecurityModeNone)
	if err != nil {
		return nil, err
	}
	c, err := opcua.NewClient(endpoint, opcua.SecurityFromEndpoint(ep, ua.UserTokenTypeAnonymous), opcua.AuthAnonymous())
	if err != nil {
		return nil, err
	}
	return c, c.Connect(ctx)
}
