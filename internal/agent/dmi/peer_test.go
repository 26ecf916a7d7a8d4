package dmi

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/framework/promtest"
)

func TestCallerSame(t *testing.T) {
	base := caller{Known: true, UID: 1000, Boot: "b1", PidNS: 7, PID: 42, Start: 99, PidIno: 5000}
	with := func(f func(*caller)) caller { c := base; f(&c); return c }
	for _, c := range []struct {
		name string
		a, b caller
		want bool
	}{
		{"itself", base, base, true},
		{"another process by pidfs, same pid", base, with(func(c *caller) { c.PidIno = 5001 }), false},
		{"pidfs wins over a different pid namespace view", base, with(func(c *caller) { c.PidNS, c.PID = 8, 0 }), true},
		{"pid reused: other start", with(func(c *caller) { c.PidIno = 0 }), with(func(c *caller) { c.PidIno, c.Start = 0, 100 }), false},
		{"same pid and start", with(func(c *caller) { c.PidIno = 0 }), with(func(c *caller) { c.PidIno = 0 }), true},
		{"other pid", with(func(c *caller) { c.PidIno = 0 }), with(func(c *caller) { c.PidIno, c.PID = 0, 43 }), false},
		{"pids of other namespaces: the uid decides", with(func(c *caller) { c.PidIno = 0 }), with(func(c *caller) { c.PidIno, c.PidNS, c.PID = 0, 8, 43 }), true},
		{"another boot: the uid decides", base, with(func(c *caller) { c.Boot, c.PidIno, c.PID = "b2", 1, 1 }), true},
		{"another boot, another uid", base, with(func(c *caller) { c.Boot, c.UID = "b2", 0 }), false},
		{"pid invisible (another pid namespace, no pidfs): same uid", caller{Known: true, UID: 1000}, caller{Known: true, UID: 1000}, true},
		{"pid invisible: other uid", caller{Known: true, UID: 1000}, caller{Known: true, UID: 1001}, false},
		{"the agent's own process is only itself", caller{}, base, false},
		{"the agent's own process", caller{}, caller{}, true},
	} {
		if got := c.a.Same(c.b); got != c.want {
			t.Errorf("%s: same = %v, want %v", c.name, got, c.want)
		}
		if got := c.b.Same(c.a); got != c.want {
			t.Errorf("%s (reversed): same = %v, want %v", c.name, got, c.want)
		}
	}
}

// A second mapper in another process: what the child of
// TestAnotherProcessReportsOnlyForItsOwnDevices does.
const childEnv = "DOWSE_DMI_TEST_CHILD"

type childResult struct {
	Code    codes.Code `json:"code"`
	Message string     `json:"message"`
}

// TestChildMapper is the child's body (it does nothing in a normal run):
// it registers the mapper named in its arguments and makes the reports
// asked, printing each answer's code and message.
func TestChildMapper(t *testing.T) {
	arg := os.Getenv(childEnv)
	if arg == "" {
		t.Skip("run by TestAnotherProcessReportsOnlyForItsOwnDevices")
	}
	var job struct {
		Socket, Name, Protocol, Address string
		Report                          []string // device names (namespace default)
	}
	if err := json.Unmarshal([]byte(arg), &job); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+job.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := dmiv1beta1.NewDeviceManagerServiceClient(conn)
	ctx := context.Background()
	var out []childResult
	if job.Name != "" {
		_, err := c.MapperRegister(ctx, &dmiv1beta1.MapperRegisterRequest{Mapper: &dmiv1beta1.MapperInfo{Name: job.Name, Protocol: job.Protocol, Address: []byte(job.Address)}})
		out = append(out, childResult{status.Code(err), status.Convert(err).Message()})
	}
	for _, d := range job.Report {
		_, err := c.ReportDeviceStatus(ctx, &dmiv1beta1.ReportDeviceStatusRequest{DeviceNamespace: "default", DeviceName: d,
			ReportedDevice: &dmiv1beta1.DeviceStatus{Twins: []*dmiv1beta1.Twin{{PropertyName: "temp", Reported: &dmiv1beta1.TwinProperty{Value: "9"}}}}})
		out = append(out, childResult{status.Code(err), status.Convert(err).Message()})
		_, err = c.ReportDeviceStates(ctx, &dmiv1beta1.ReportDeviceStatesRequest{DeviceNamespace: "default", DeviceName: d, State: "ok"})
		out = append(out, childResult{status.Code(err), status.Convert(err).Message()})
	}
	b, _ := json.Marshal(out)
	fmt.Printf("RESULT %s\n", b)
}

// runChild runs TestChildMapper in a new process of this test binary.
func runChild(t *testing.T, job any) []childResult {
	t.Helper()
	arg, _ := json.Marshal(job)
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildMapper$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+string(arg))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if r, ok := strings.CutPrefix(l, "RESULT "); ok {
			var res []childResult
			if err := json.Unmarshal([]byte(r), &res); err != nil {
				t.Fatal(err)
			}
			return res
		}
	}
	t.Fatalf("child printed no result:\n%s", out)
	return nil
}

// TestAnotherProcessReportsOnlyForItsOwnDevices: a second mapper, in
// another process, may report for the Device it serves and is refused,
// with PermissionDenied naming the Device, for the first one's; the first
// keeps reporting; a process that registered nothing is refused too; a
// mapper remembered by an agent that did not record who registered it
// adopts the process serving its socket.
func TestAnotherProcessReportsOnlyForItsOwnDevices(t *testing.T) {
	dir := t.TempDir()
	edge := newFakeEdge()
	edge.putModel(model("thermo", "virtual"))
	edge.putModel(model("pump", "modbus"))
	edge.putDevice(device("first-dev", "thermo", "virtual", "", "1"))
	edge.putDevice(device("second-dev", "pump", "modbus", "", "1"))
	r := startServer(t, dir, edge, nil)
	first := startFakeMapper(t, filepath.Join(dir, "first.sock"))
	register(t, r.client, "first", "virtual", first.sock, false)

	sock := filepath.Join(dir, "dmi", "dmi.sock")
	got := runChild(t, map[string]any{"Socket": sock, "Name": "second", "Protocol": "modbus", "Address": filepath.Join(dir, "second.sock"),
		"Report": []string{"second-dev", "first-dev"}})
	want := []struct {
		code codes.Code
		msg  string
	}{
		{codes.OK, ""}, {codes.OK, ""}, {codes.OK, ""},
		{codes.PermissionDenied, `device default/first-dev is served by mapper "first", which another process registered`},
		{codes.PermissionDenied, `device default/first-dev is served by mapper "first"`},
	}
	if len(got) != len(want) {
		t.Fatalf("child answers %v", got)
	}
	for i, w := range want {
		if got[i].Code != w.code || !strings.Contains(got[i].Message, w.msg) {
			t.Errorf("child answer %d: %v %q, want %v with %q", i, got[i].Code, got[i].Message, w.code, w.msg)
		}
	}
	// The first mapper's process keeps reporting.
	if _, err := r.client.ReportDeviceStatus(context.Background(), &dmiv1beta1.ReportDeviceStatusRequest{DeviceNamespace: "default", DeviceName: "first-dev",
		ReportedDevice: &dmiv1beta1.DeviceStatus{Twins: []*dmiv1beta1.Twin{{PropertyName: "temp", Reported: &dmiv1beta1.TwinProperty{Value: "3"}}}}}); err != nil {
		t.Fatalf("the first mapper: %v", err)
	}
	// A process that registered no mapper.
	got = runChild(t, map[string]any{"Socket": sock, "Report": []string{"first-dev"}})
	if len(got) != 2 || got[0].Code != codes.PermissionDenied || got[1].Code != codes.PermissionDenied {
		t.Fatalf("unregistered process: %v", got)
	}
	if n := promtest.Sum(t, r.reg, "dowse_dmi_reports_refused_total", map[string]string{"reason": reasonNotYours}); n != 4 {
		t.Errorf("refused not-its-device: %v, want 4", n)
	}
	edge.mu.Lock()
	for _, rep := range edge.reports {
		if rep.Device.Name == "first-dev" && rep.GetReported().GetValue() == "9" {
			t.Errorf("a refused report was stored: %v", rep)
		}
	}
	edge.mu.Unlock()

	// An agent that remembered the mappers without who registered them
	// (before this was recorded): the first mapper's socket is served by
	// this process, so its reports are taken, and the second's, served by
	// nobody now, are not.
	r.stop()
	file := filepath.Join(dir, "dmi-mappers.json")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var saved []map[string]any
	if err := json.Unmarshal(b, &saved); err != nil {
		t.Fatal(err)
	}
	for _, m := range saved {
		if m["caller"] == nil {
			t.Fatalf("mapper %v remembered without its caller", m["name"])
		}
		delete(m, "caller")
	}
	b, _ = json.Marshal(saved)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r = startServer(t, dir, edge, nil)
	if _, err := r.client.ReportDeviceStates(context.Background(), &dmiv1beta1.ReportDeviceStatesRequest{DeviceNamespace: "default", DeviceName: "first-dev", State: "ok"}); err != nil {
		t.Fatalf("the first mapper after the restart: %v", err)
	}
	got = runChild(t, map[string]any{"Socket": sock, "Report": []string{"second-dev"}})
	if len(got) != 2 || got[0].Code != codes.PermissionDenied || !strings.Contains(got[0].Message, "second.sock") {
		t.Fatalf("a mapper whose socket nobody serves: %v", got)
	}
	b, _ = os.ReadFile(file)
	if !strings.Contains(string(b), `"caller"`) {
		t.Errorf("the adopted caller is not remembered: %s", b)
	}
}

// TestCallerOfThisProcess: the kernel's word on a connection from this
// process names it (and, with pidfs, by an inode).
func TestCallerOfThisProcess(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		c, err := lis.Accept()
		if err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	who, err := listenerOf(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	if !who.Known || who.PID != int32(os.Getpid()) || who.UID != uint32(os.Getuid()) || who.Start == 0 || who.Boot == "" || who.PidNS == 0 {
		t.Fatalf("caller %+v, want this process (pid %d, uid %d) with its start time, boot and pid namespace", who, os.Getpid(), os.Getuid())
	}
	if !who.Same(who) {
		t.Fatal("a caller is not itself")
	}
	t.Logf("caller %+v (pidfs inode %d: 0 on kernels before 6.9)", who, who.PidIno)
}

// TestNameStaysWithItsLiveProcess: another process may not register under a
// name whose registrant still serves its socket (PermissionDenied, saying
// why), nor take a protocol's unnamed Devices by registering a name that
// sorts first; once the first mapper's socket is served by nobody, its name
// is free.
func TestNameStaysWithItsLiveProcess(t *testing.T) {
	dir := t.TempDir()
	edge := newFakeEdge()
	edge.putModel(model("pump", "modbus"))
	edge.putDevice(device("pump-1", "pump", "modbus", "", "1"))
	r := startServer(t, dir, edge, nil)
	plc := startFakeMapper(t, filepath.Join(dir, "plc.sock"))
	register(t, r.client, "plc", "modbus", plc.sock, false)
	waitFor(t, "pump-1 sent to plc", func() error {
		if plc.has("default/pump-1") == nil {
			return fmt.Errorf("plc holds %v", plc.callList())
		}
		return nil
	})
	sock := filepath.Join(dir, "dmi", "dmi.sock")
	owner := func() string {
		r.srv.mu.Lock()
		defer r.srv.mu.Unlock()
		name, _ := r.srv.ownerLocked(r.srv.devices["default/pump-1"], r.srv.askedLocked())
		return name
	}

	got := runChild(t, map[string]any{"Socket": sock, "Name": "plc", "Protocol": "modbus", "Address": filepath.Join(dir, "evil.sock")})
	if len(got) != 1 || got[0].Code != codes.PermissionDenied || !strings.Contains(got[0].Message, "still serves "+plc.sock) {
		t.Fatalf("another process registering a live mapper's name: %v, want PermissionDenied saying the name is held", got)
	}
	if o := owner(); o != "plc" {
		t.Errorf("pump-1 served by %q after the refused takeover, want plc", o)
	}

	// A name that sorts first is a new mapper of the protocol, not the
	// owner of its Devices.
	got = runChild(t, map[string]any{"Socket": sock, "Name": "a", "Protocol": "modbus", "Address": filepath.Join(dir, "a.sock")})
	if len(got) != 1 || got[0].Code != codes.OK {
		t.Fatalf("registering a new name: %v", got)
	}
	if o := owner(); o != "plc" {
		t.Errorf("pump-1 served by %q after mapper a registered, want plc (the first registered)", o)
	}

	// The first mapper is gone: its name may be taken.
	plc.srv.Stop()
	got = runChild(t, map[string]any{"Socket": sock, "Name": "plc", "Protocol": "modbus", "Address": filepath.Join(dir, "plc2.sock")})
	if len(got) != 1 || got[0].Code != codes.OK {
		t.Fatalf("registering the name of a mapper whose socket nobody serves: %v", got)
	}
}
