// Package dmi_test proves the node's mapper API against a mapper built on
// KubeEdge's own mapper-framework v1.21.0 runtime (test/peers/kubeedge-mapper, a
// module of its own), with the real agent edge parts (edgehub, edge store,
// internal/agent/dmi wired as agent/mappers.go wires them) and a real cloudhub.
package dmi_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/dowse-dev/dowse/internal/agent/dmi"
	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/link/pki"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/promtest"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/kubeedgepeer"
)

const node = "edge-1"

// cloud is a cloudhub whose handler records what the node sends.
type cloud struct {
	hub    *cloudhub.Hub
	cancel context.CancelFunc
	done   chan error

	mu         sync.Mutex
	reported   []*linkv1.TwinReportedUpdate
	states     []*linkv1.DeviceStateUpdate
	conditions []*linkv1.DeviceCondition
}

func startCloud(t testing.TB, serverTLS *tls.Config, addr string) *cloud {
	t.Helper()
	c := &cloud{done: make(chan error, 1)}
	hub, err := cloudhub.New(cloudhub.Config{WebSocketAddr: addr, TLS: serverTLS, Heartbeat: 100 * time.Millisecond, RateLimit: 1e5, RateBurst: 1000},
		allowAll{}, func(_ context.Context, m cloudhub.Inbound) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			if r := m.Env.GetTwinReported(); r != nil {
				c.reported = append(c.reported, r)
			}
			if s := m.Env.GetDeviceState(); s != nil {
				c.states = append(c.states, s)
			}
			if cond := m.Env.GetDeviceCondition(); cond != nil {
				c.conditions = append(c.conditions, cond)
			}
			return nil
		}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { c.done <- hub.Start(ctx) }()
	select {
	case <-hub.Ready():
	case err := <-c.done:
		t.Fatal(err)
	}
	c.hub, c.cancel = hub, cancel
	t.Cleanup(c.stop)
	return c
}

func (c *cloud) stop() {
	if c.cancel != nil {
		c.cancel()
		<-c.done
		c.cancel = nil
	}
}

func (c *cloud) addr() string { ws, _ := c.hub.Addrs(); return ws.String() }

// find returns the reports matching f.
func (c *cloud) find(f func(*linkv1.TwinReportedUpdate) bool) []*linkv1.TwinReportedUpdate {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*linkv1.TwinReportedUpdate
	for _, r := range c.reported {
		if f(r) {
			out = append(out, r)
		}
	}
	return out
}

func (c *cloud) send(t testing.TB, env *linkv1.Envelope) {
	t.Helper()
	if _, err := c.hub.Send(node, env); err != nil {
		t.Fatal(err)
	}
}

type allowAll struct{}

func (allowAll) AuthorizeDevice(context.Context, string, *linkv1.DeviceRef) error { return nil }

// agentEdge is the agent's edge half: edgehub and store, and the mapper
// API on them, wired as agent/mappers.go does.
type agentEdge struct {
	hub    *edgehub.EdgeHub
	dmi    *dmi.Server
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
}

func startAgent(t testing.TB, stateDir string, dialer link.Dialer, logs *procs.Lines, noSync bool) *agentEdge {
	t.Helper()
	reg := prometheus.NewRegistry()
	a := &agentEdge{reg: reg, done: make(chan struct{})}
	hub, err := edgehub.New(edgehub.Config{Node: node, Dialer: dialer, StateDir: stateDir, Heartbeat: 100 * time.Millisecond,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, NoSync: noSync}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := dmi.New(dmi.Config{StateDir: stateDir, Node: node, CallTimeout: 2 * time.Second, RetryMin: 50 * time.Millisecond, RetryMax: 500 * time.Millisecond},
		hub, dmi.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	a.hub, a.dmi = hub, srv
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(logs, prefix+" "+args) }, funcr.Options{Verbosity: 1})
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), log))
	a.cancel = cancel
	mctx, stopMappers := context.WithCancel(ctx)
	hctx, stopHub := context.WithCancel(context.WithoutCancel(ctx))
	mdone := make(chan struct{})
	go func() {
		defer close(mdone)
		if err := srv.Start(mctx); err != nil {
			fmt.Fprintln(logs, "dmi: "+err.Error())
		}
	}()
	go func() {
		<-ctx.Done()
		stopMappers()
		<-mdone
		stopHub()
	}()
	go func() {
		defer close(a.done)
		_ = hub.Start(hctx) // closes the store when it returns
		stopMappers()
		<-mdone
	}()
	waitFor(t, "dmi.sock", func() error { _, err := os.Stat(filepath.Join(stateDir, "dmi", "dmi.sock")); return err })
	t.Cleanup(a.stop)
	return a
}

func (a *agentEdge) stop() {
	if a.cancel != nil {
		a.cancel()
		<-a.done
		a.cancel = nil
	}
}

// waitFor waits 30 s for cond, saying what it waited for when it fails.
func waitFor(t testing.TB, what string, cond func() error) {
	t.Helper()
	testwait.For(t, 30*time.Second, func() error {
		if err := cond(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
}

func ref(name string) *linkv1.DeviceRef { return &linkv1.DeviceRef{Namespace: "default", Name: name} }

func visitor(t testing.TB, initial any) *structpb.Struct {
	s, err := structpb.NewStruct(map[string]any{"initial": initial})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func thermoModel() *linkv1.Envelope {
	return &linkv1.Envelope{Kind: &linkv1.Envelope_ModelUpdate{ModelUpdate: &linkv1.DeviceModelUpdate{Model: &linkv1.EdgeDeviceModel{
		Ref: ref("thermo"), Generation: 1, Protocol: "virtual", Properties: []*linkv1.EdgeModelProperty{
			{Name: "temp", Type: "INT", AccessMode: "ReadWrite"},
			{Name: "label", Type: "STRING", AccessMode: "ReadOnly"},
			{Name: "ratio", Type: "DOUBLE", AccessMode: "ReadOnly"},
		}}}}}
}

// thermo1 has a desired temp; ghost is a property its model lacks (the
// cloud validates Devices, but the edge does not trust that).
func thermo1(t testing.TB, gen int64, desired string) *linkv1.Envelope {
	cfg, _ := structpb.NewStruct(map[string]any{"address": "sim://thermo-1", "slaveID": 1})
	return &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceUpdate{DeviceUpdate: &linkv1.DeviceUpdate{Device: &linkv1.EdgeDevice{
		Ref: ref("thermo-1"), Generation: gen, Model: "thermo", ProtocolName: "virtual", ProtocolConfig: cfg,
		Properties: []*linkv1.EdgeDeviceProperty{
			{Name: "temp", Desired: &linkv1.TwinValue{Value: desired, Metadata: map[string]string{"type": "int"}}, VisitorConfig: visitor(t, 20), CollectCycleMs: 100, ReportToCloud: true},
			{Name: "label", VisitorConfig: visitor(t, "lab-1"), CollectCycleMs: 100, ReportToCloud: true},
			{Name: "ratio", VisitorConfig: visitor(t, 0.5), CollectCycleMs: 100, ReportToCloud: true},
			{Name: "ghost", VisitorConfig: visitor(t, 1), CollectCycleMs: 100, ReportToCloud: true},
		}}}}}
}

// thermoBad reads a temp that is not an INT.
func thermoBad(t *testing.T) *linkv1.Envelope {
	return &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceUpdate{DeviceUpdate: &linkv1.DeviceUpdate{Device: &linkv1.EdgeDevice{
		Ref: ref("thermo-bad"), Generation: 1, Model: "thermo", ProtocolName: "virtual",
		Properties: []*linkv1.EdgeDeviceProperty{{Name: "temp", VisitorConfig: visitor(t, "warm"), CollectCycleMs: 100, ReportToCloud: true}},
	}}}}
}

// intV reads an INT's text as the link carries it.
func intV(v *linkv1.TwinValue) (int64, bool) {
	if v == nil {
		return 0, false
	}
	i, err := strconv.ParseInt(v.GetValue(), 10, 64)
	return i, err == nil
}

// TestKubeEdgeMapperFramework: a mapper built on mapper-framework v1.21.0,
// and one on v1.23.0, registers with the agent's dmi.sock as with edgecore, gets the Device the
// cloud sends (RegisterDevice), applies its desired value and reports it
// back, typed and with observedDesired, to the cloudhub; reports the edge
// cannot accept are refused with InvalidArgument; a desired change
// reaches it (UpdateDevice); an agent restarted while the cloud is down
// tells the mapper its devices again from the store, a restarted mapper
// gets them with MapperRegister, and what they report offline reaches the
// cloud when it is back.
func TestKubeEdgeMapperFramework(t *testing.T) {
	for _, v := range kubeedgepeer.Versions {
		t.Run(v, func(t *testing.T) { kubeEdgeMapperFramework(t, v) })
	}
}

func kubeEdgeMapperFramework(t *testing.T, version string) {
	tmp := t.TempDir()
	bin := kubeedgepeer.Build(t, tmp, version)
	stateDir := filepath.Join(tmp, "state")
	mapperDir := filepath.Join(tmp, "mapper")
	if err := os.MkdirAll(mapperDir, 0o700); err != nil {
		t.Fatal(err)
	}
	dmiSock := filepath.Join(stateDir, "dmi", "dmi.sock")

	ca, err := pki.NewCA("dowse-dmi-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srvCert, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serverTLS := pki.ServerTLSConfig(pki.Static[*tls.ClientHelloInfo](srvCert), ca.Pool())
	nodeCert, err := ca.IssueNode(node, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clientTLS := pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](nodeCert), ca.Pool(), "127.0.0.1")

	c := startCloud(t, serverTLS, "127.0.0.1:0")
	addr := c.addr()
	dialer, err := link.NewDialer(link.WebSocket, addr, clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	logs := procs.NewLines()
	agent := startAgent(t, stateDir, dialer, logs, true)
	waitFor(t, "link up", func() error {
		if !agent.hub.Connected() {
			return fmt.Errorf("not connected")
		}
		return nil
	})

	m := kubeedgepeer.Start(t, bin, mapperDir, dmiSock)
	waitFor(t, "mapper registers", func() error {
		if m.Out.Count("EVENT registered devices=0") != 1 {
			return fmt.Errorf("mapper stdout:\n%s\nstderr:\n%s", m.Out, m.Stderr)
		}
		return nil
	})

	// The cloud assigns the model and two devices.
	c.send(t, thermoModel())
	c.send(t, thermo1(t, 1, "25"))
	c.send(t, thermoBad(t))
	c.send(t, &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceInventory{DeviceInventory: &linkv1.DeviceInventory{
		Node: node, Devices: []*linkv1.DeviceRef{ref("thermo-1"), ref("thermo-bad")}, Models: []*linkv1.DeviceRef{ref("thermo")}}}})

	waitFor(t, "RegisterDevice reaches the framework mapper, desired applied", func() error {
		if m.Out.Count("EVENT device-started id=default/thermo-1 desired=temp:25") < 1 {
			return fmt.Errorf("mapper stdout:\n%s\nagent:\n%s", m.Out, logs)
		}
		return nil
	})
	waitFor(t, "reports reach the cloud in their types' text, with observedDesired", func() error {
		temp := c.find(func(r *linkv1.TwinReportedUpdate) bool {
			v, ok := intV(r.Reported)
			od, ok2 := intV(r.ObservedDesired)
			return r.Device.GetName() == "thermo-1" && r.Property == "temp" && ok && v == 25 && ok2 && od == 25
		})
		label := c.find(func(r *linkv1.TwinReportedUpdate) bool {
			return r.Device.GetName() == "thermo-1" && r.Property == "label" && r.GetReported().GetValue() == "lab-1" && r.ObservedDesired == nil
		})
		// 0.5 went as configData through a FloatValue and back as text.
		ratio := c.find(func(r *linkv1.TwinReportedUpdate) bool {
			return r.Device.GetName() == "thermo-1" && r.Property == "ratio" && r.GetReported().GetValue() == "0.5"
		})
		if len(temp) == 0 || len(label) == 0 || len(ratio) == 0 {
			return fmt.Errorf("temp %d, label %d, ratio %d reports; mapper:\n%s", len(temp), len(label), len(ratio), m.Out)
		}
		r := temp[0]
		if md := r.GetReported().GetMetadata(); md["timestamp"] == "" || fmt.Sprint(r.Time.AsTime().UnixMilli()) != md["timestamp"] {
			return fmt.Errorf("report time %v does not come from its timestamp metadata %v", r.Time.AsTime(), md)
		}
		return nil
	})
	waitFor(t, "device state reaches the cloud", func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, s := range c.states {
			if s.Device.GetName() == "thermo-1" && s.State == "ok" && s.Mapper == "virtual-mapper" {
				return nil
			}
		}
		return fmt.Errorf("%d states", len(c.states))
	})

	// Refusals, seen by the framework mapper's own client.
	waitFor(t, "unknown property and bad value refused with InvalidArgument", func() error {
		if m.Out.Count("report-refused id=default/thermo-1 property=ghost code=InvalidArgument", "model default/thermo has no such property") == 0 {
			return fmt.Errorf("no ghost refusal; mapper:\n%s", m.Out)
		}
		if m.Out.Count("report-refused id=default/thermo-bad property=temp code=InvalidArgument", `is not an INT`) == 0 {
			return fmt.Errorf("no bad-value refusal; mapper:\n%s", m.Out)
		}
		return nil
	})
	waitFor(t, "the refused properties reach the cloud as each Device's ReportsAccepted condition", func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		var ghost, bad bool
		for _, cond := range c.conditions {
			if cond.Type != "ReportsAccepted" || cond.Status || cond.Mapper != "virtual-mapper" {
				continue
			}
			ghost = ghost || cond.Device.GetName() == "thermo-1" && strings.Contains(cond.Message, `property "ghost": model default/thermo has no such property`)
			bad = bad || cond.Device.GetName() == "thermo-bad" && strings.Contains(cond.Message, `property "temp": reported value "warm" is not an INT`)
		}
		if !ghost || !bad {
			return fmt.Errorf("conditions %v", c.conditions)
		}
		return nil
	})
	// An unknown device, with a DMI client of our own on the same socket.
	conn, err := grpc.NewClient("unix://"+dmiSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = dmiv1beta1.NewDeviceManagerServiceClient(conn).ReportDeviceStatus(context.Background(), &dmiv1beta1.ReportDeviceStatusRequest{
		DeviceNamespace: "default", DeviceName: "stranger", ReportedDevice: &dmiv1beta1.DeviceStatus{Twins: []*dmiv1beta1.Twin{{PropertyName: "temp", Reported: &dmiv1beta1.TwinProperty{Value: "1"}}}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "default/stranger is not assigned to node "+node) {
		t.Fatalf("report for an unknown device: %v", err)
	}
	// A second mapper, this test's process, serves another protocol: it
	// may not report for the framework mapper's Device.
	other := dmiv1beta1.NewDeviceManagerServiceClient(conn)
	if _, err := other.MapperRegister(context.Background(), &dmiv1beta1.MapperRegisterRequest{Mapper: &dmiv1beta1.MapperInfo{
		Name: "other-mapper", Protocol: "other", Address: []byte(filepath.Join(tmp, "other.sock"))}}); err != nil {
		t.Fatal(err)
	}
	_, err = other.ReportDeviceStatus(context.Background(), &dmiv1beta1.ReportDeviceStatusRequest{
		DeviceNamespace: "default", DeviceName: "thermo-1", ReportedDevice: &dmiv1beta1.DeviceStatus{Twins: []*dmiv1beta1.Twin{{PropertyName: "temp", Reported: &dmiv1beta1.TwinProperty{Value: "99"}}}}})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `device default/thermo-1 is served by mapper "virtual-mapper", which another process registered`) {
		t.Fatalf("a second mapper's report for the first one's device: %v", err)
	}
	if n := len(c.find(func(r *linkv1.TwinReportedUpdate) bool {
		v, _ := intV(r.Reported)
		return r.Property == "ghost" || r.Device.GetName() == "thermo-bad" || v == 99
	})); n != 0 {
		t.Fatalf("%d refused reports reached the cloud", n)
	}
	for _, reason := range []string{"unknown-property", "bad-value", "unknown-device"} {
		if promtest.Sum(t, agent.reg, "dowse_dmi_reports_refused_total", map[string]string{"reason": reason}) == 0 {
			t.Errorf("refusals for %s not counted", reason)
		}
	}

	// A desired change: UpdateDevice, applied, reported back.
	c.send(t, thermo1(t, 2, "30"))
	waitFor(t, "desired 30 applied and reported", func() error {
		if m.Out.Count("EVENT device-started id=default/thermo-1 desired=temp:30") < 1 {
			return fmt.Errorf("mapper:\n%s", m.Out)
		}
		if len(c.find(func(r *linkv1.TwinReportedUpdate) bool {
			v, _ := intV(r.Reported)
			od, _ := intV(r.ObservedDesired)
			return r.Property == "temp" && r.Device.GetName() == "thermo-1" && v == 30 && od == 30
		})) == 0 {
			return fmt.Errorf("no report of 30")
		}
		return nil
	})

	// The cloud goes away; then the agent restarts, still without it.
	c.stop()
	agent.stop()
	started := m.Out.Count("EVENT device-started id=default/thermo-1 desired=temp:30")
	reported := m.Out.Count("report-ok id=default/thermo-1")
	agent = startAgent(t, stateDir, dialer, logs, true)
	waitFor(t, "the restarted agent tells the remembered mapper its devices from the store, and takes its reports", func() error {
		if m.Out.Count("EVENT device-started id=default/thermo-1 desired=temp:30") <= started || m.Out.Count("report-ok id=default/thermo-1") <= reported+2 {
			return fmt.Errorf("mapper:\n%s\nagent:\n%s", m.Out, logs)
		}
		return nil
	})

	// The mapper restarts too: MapperRegister(withData) hands it both
	// devices and the model from the store.
	m.Kill()
	m2 := kubeedgepeer.Start(t, bin, mapperDir, dmiSock)
	waitFor(t, "the restarted mapper gets its devices from the store", func() error {
		if m2.Out.Count("EVENT registered devices=2 models=1") != 1 || m2.Out.Count("report-ok id=default/thermo-1 property=temp value=30") == 0 {
			return fmt.Errorf("mapper:\n%s\nstderr:\n%s", m2.Out, m2.Stderr)
		}
		return nil
	})
	if agent.hub.Connected() {
		t.Fatal("the link is up with the cloud stopped")
	}
	if agent.hub.Pending() == 0 {
		t.Fatal("nothing stored while offline")
	}

	// The cloud is back at the same address: what was reported offline
	// arrives.
	c2 := startCloud(t, serverTLS, addr)
	waitFor(t, "offline reports reach the cloud", func() error {
		if len(c2.find(func(r *linkv1.TwinReportedUpdate) bool {
			v, _ := intV(r.Reported)
			return r.Device.GetName() == "thermo-1" && r.Property == "temp" && v == 30
		})) == 0 {
			return fmt.Errorf("nothing yet")
		}
		return nil
	})
	t.Logf("first mapper:\n%s\nrestarted mapper:\n%s", m.Out, m2.Out)
}
