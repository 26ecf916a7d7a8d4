package opcua_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	mopcua "github.com/dowse-dev/dowse/mappers/opcua"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

const (
	peerStart = npmpeer.OPCUAStart
	wait      = 20 * time.Second
)

// startServer runs node-opcua's conformance server (the launcher the OPC
// UA discovery handler's tests use) and returns its endpoint.
func startServer(t *testing.T) (func() *npmpeer.Process, *npmpeer.Process, string) {
	t.Helper()
	return startServerWith(t, nil)
}

// startServerWith starts the server with extra launcher settings (users).
func startServerWith(t *testing.T, extra map[string]any) (func() *npmpeer.Process, *npmpeer.Process, string) {
	t.Helper()
	port := npmpeer.FreePort(t, "127.0.0.1")
	settings := map[string]any{
		"kind": "server", "port": port, "pkiDir": filepath.Join(t.TempDir(), "pki"),
		"applicationName": "mapper-test", "applicationUri": "urn:dowse:test:mapper",
	}
	for k, v := range extra {
		settings[k] = v
	}
	start := func() *npmpeer.Process {
		proc := npmpeer.StartOPCUA(t, "node-opcua", settings)
		proc.WaitLine(t, "READY", 0, peerStart)
		return proc
	}
	return start, start(), "opc.tcp://127.0.0.1:" + strconv.Itoa(port)
}

var model = mappertest.NewModel("default", "opcua-sim",
	mappertest.ModelProp("int32", "INT", "ReadWrite", "-100000", "100000"),
	mappertest.ModelProp("double", "DOUBLE", "ReadWrite", "", ""),
	mappertest.ModelProp("simulated", "DOUBLE", "ReadOnly", "", ""),
	mappertest.ModelProp("serverTime", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("missing", "INT", "ReadOnly", "", ""),
)

func TestOPCUAMapperAgainstNodeOPCUA(t *testing.T) {
	restart, server, endpoint := startServer(t)
	props := []mappertest.Prop{
		{Name: "int32", Visitor: map[string]any{"nodeId": "ns=2;s=Static_Scalar_Int32"}, CollectCycle: 100 * time.Millisecond},
		{Name: "double", Visitor: map[string]any{"nodeId": "ns=2;s=Static_Scalar_Double"}, CollectCycle: 100 * time.Millisecond},
		{Name: "serverTime", Visitor: map[string]any{"nodeId": "i=2258"}, CollectCycle: 100 * time.Millisecond},
		// Pushed by the server: no collect cycle at all.
		{Name: "simulated", Visitor: map[string]any{"nodeId": "ns=2;s=Scalar_Simulation_Double", "subscribe": true}},
		{Name: "missing", Visitor: map[string]any{"nodeId": "ns=2;s=No_Such_Node"}, CollectCycle: 100 * time.Millisecond},
	}
	plain := mappertest.NewDevice(t, "default", "sim", "opcua-sim", mopcua.Protocol, map[string]any{"endpoint": endpoint, "timeout": "3s"}, props...)
	secure := mappertest.NewDevice(t, "default", "sim-secure", "opcua-sim", mopcua.Protocol, map[string]any{
		"endpoint": endpoint, "securityPolicy": "Basic256Sha256", "securityMode": "SignAndEncrypt", "timeout": "3s"}, props[:3]...)

	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, []*dmiv1beta1.Device{plain, secure})
	mappertest.RunMapper(t, mapper.Config{Protocol: mopcua.Protocol, StateDir: dir, NewDriver: mopcua.NewDriver, Logger: testr.New(t),
		ReconnectInitial: 100 * time.Millisecond, ReconnectMax: time.Second, ReregisterInterval: time.Hour, CallTimeout: 10 * time.Second})
	ctx := t.Context()

	t.Run("reads, and an unknown node is a clear error", func(t *testing.T) {
		for _, dev := range []string{"default/sim", "default/sim-secure"} {
			agent.WaitState(t, dev, "ok", wait)
			agent.WaitTwin(t, dev, "serverTime", 0, wait, func(tw *dmiv1beta1.Twin) bool {
				_, err := time.Parse(time.RFC3339Nano, tw.GetReported().GetValue())
				return err == nil
			})
			agent.WaitTwin(t, dev, "int32", 0, wait, func(tw *dmiv1beta1.Twin) bool {
				_, err := strconv.Atoi(tw.GetReported().GetValue())
				return err == nil
			})
		}
		// The first error may be the connection's (node-opcua answers
		// slowly on a loaded machine); the read's own comes once connected.
		var e string
		for deadline := time.Now().Add(wait); ; time.Sleep(50 * time.Millisecond) {
			e = agent.WaitDeviceError(t, "default", "sim", "missing", wait)
			if strings.Contains(strings.ToLower(e), "badnodeidunknown") || time.Now().After(deadline) {
				break
			}
		}
		if !strings.Contains(strings.ToLower(e), "badnodeidunknown") {
			t.Errorf("unknown node: %q", e)
		} else {
			t.Logf("unknown node: %s", e)
		}
	})

	t.Run("subscription reports each change without polling", func(t *testing.T) {
		seen := map[string]bool{}
		from := 0
		deadline := time.Now().Add(wait)
		for len(seen) < 3 && time.Now().Before(deadline) {
			tw, next := agent.WaitTwin(t, "default/sim", "simulated", from, wait, func(tw *dmiv1beta1.Twin) bool {
				return tw.GetReported().GetValue() != "" && !seen[tw.GetReported().GetValue()]
			})
			seen[tw.GetReported().GetValue()] = true
			from = next
		}
		if len(seen) < 3 {
			t.Fatalf("subscription reported %d distinct values", len(seen))
		}
		t.Logf("pushed values: %v", seen)
	})

	t.Run("a desired value is written and read back by another client", func(t *testing.T) {
		want := 4242 + time.Now().Nanosecond()%1000
		dev := mappertest.SetDesired(plain, "int32", strconv.Itoa(want))
		dev = mappertest.SetDesired(dev, "double", "2.75")
		from := agent.ReportCount()
		if _, err := agent.Mapper(t).UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: dev}); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"int32", "double"} {
			tw, _ := agent.WaitTwin(t, "default/sim", p, from, wait, func(tw *dmiv1beta1.Twin) bool {
				return tw.GetObservedDesired() != nil || tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError] != ""
			})
			if e := tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError]; e != "" {
				t.Fatalf("writing %s: %s", p, e)
			}
		}
		agent.WaitReported(t, "default/sim", "int32", strconv.Itoa(want), from, wait)
		if got := readWithOtherClient(t, endpoint, "ns=2;s=Static_Scalar_Int32"); got != int32(want) {
			t.Errorf("another client reads %v, want %d", got, want)
		}
		if got := readWithOtherClient(t, endpoint, "ns=2;s=Static_Scalar_Double"); got != 2.75 {
			t.Errorf("another client reads %v, want 2.75", got)
		}
		// Outside the model's bounds: refused before any write.
		from = agent.ReportCount()
		dev = mappertest.SetDesired(dev, "int32", "100001")
		if _, err := agent.Mapper(t).UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: dev}); err != nil {
			t.Fatal(err)
		}
		tw, _ := agent.WaitTwin(t, "default/sim", "int32", from, wait, func(tw *dmiv1beta1.Twin) bool {
			return tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError] != ""
		})
		t.Logf("out of bounds: %s", tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError])
		if got := readWithOtherClient(t, endpoint, "ns=2;s=Static_Scalar_Int32"); got != int32(want) {
			t.Errorf("after a refused value another client reads %v, want %d", got, want)
		}
	})

	t.Run("server stopped and started: offline, then ok, subscription back", func(t *testing.T) {
		server.Stop()
		agent.WaitState(t, "default/sim", "offline", wait)
		from := agent.ReportCount()
		restart()
		agent.WaitState(t, "default/sim", "ok", peerStart)
		agent.WaitState(t, "default/sim-secure", "ok", peerStart)
		// The restarted server starts from its initial values; the pushed
		// property comes back on a new subscription.
		seen := map[string]bool{}
		for len(seen) < 2 {
			tw, next := agent.WaitTwin(t, "default/sim", "simulated", from, wait, func(tw *dmiv1beta1.Twin) bool {
				return tw.GetReported().GetValue() != "" && tw.GetReported().GetMetadata()[twinvalue.MetaError] == "" && !seen[tw.GetReported().GetValue()]
			})
			seen[tw.GetReported().GetValue()] = true
			from = next
		}
	})
}

// readWithOtherClient reads a node's value on a connection of its own.
func readWithOtherClient(t *testing.T, endpoint, node string) any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	eps, err := opcua.GetEndpoints(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := opcua.SelectEndpoint(eps, "None", ua.MessageSecurityModeNone)
	if err != nil {
		t.Fatal(err)
	}
	c, err := opcua.NewClient(endpoint, opcua.SecurityFromEndpoint(ep, ua.UserTokenTypeAnonymous), opcua.AuthAnonymous())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	id := ua.MustParseNodeID(node)
	resp, err := c.Read(ctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: id, AttributeID: ua.AttributeIDValue}}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Results[0].Status != ua.StatusOK {
		t.Fatal(fmt.Errorf("reading %s: %w", node, resp.Results[0].Status))
	}
	return resp.Results[0].Value.Value()
}

// A server that takes only user names and passwords (node-opcua's
// userManager, anonymous sessions refused): the mapper's session with the
// right password reads and writes, with a wrong one or none it is refused,
// and the server's own check says which user it saw.
func TestOPCUAMapperUserNameAgainstNodeOPCUA(t *testing.T) {
	t.Parallel()
	_, server, endpoint := startServerWith(t, map[string]any{"users": []map[string]string{{"user": "plant", "password": "s3cret-Pw"}}})
	props := []mappertest.Prop{{Name: "int32", Visitor: map[string]any{"nodeId": "ns=2;s=Static_Scalar_Int32"}, CollectCycle: 100 * time.Millisecond}}
	device := func(name string, protocol map[string]any) *dmiv1beta1.Device {
		protocol["endpoint"], protocol["timeout"] = endpoint, "3s"
		return mappertest.NewDevice(t, "default", name, "opcua-sim", mopcua.Protocol, protocol, props...)
	}
	right := device("right", map[string]any{"username": "plant", "password": "s3cret-Pw"})
	// The password encrypted for the server's certificate on a signed and
	// encrypted channel too.
	rightSecure := device("right-secure", map[string]any{"username": "plant", "password": "s3cret-Pw",
		"securityPolicy": "Basic256Sha256", "securityMode": "SignAndEncrypt"})
	wrong := device("wrong", map[string]any{"username": "plant", "password": "guess"})
	anonymous := device("anonymous", map[string]any{})

	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, []*dmiv1beta1.Device{right, rightSecure, wrong, anonymous})
	mappertest.RunMapper(t, mapper.Config{Protocol: mopcua.Protocol, StateDir: dir, NewDriver: mopcua.NewDriver, Logger: testr.New(t),
		ReconnectInitial: 200 * time.Millisecond, ReconnectMax: 2 * time.Second, ReregisterInterval: time.Hour, CallTimeout: 10 * time.Second})
	ctx := t.Context()

	for _, dev := range []string{"default/right", "default/right-secure"} {
		agent.WaitState(t, dev, "ok", wait)
		agent.WaitTwin(t, dev, "int32", 0, wait, func(tw *dmiv1beta1.Twin) bool {
			_, err := strconv.Atoi(tw.GetReported().GetValue())
			return err == nil
		})
	}
	server.WaitLine(t, "AUTH plant ok", 0, wait)
	server.WaitLine(t, "AUTH plant refused", 0, wait)

	// Refused sessions: offline, the server's refusal in the twins' error,
	// never a value.
	for name, refusal := range map[string]string{"wrong": "BadUserAccessDenied", "anonymous": "BadIdentityToken"} {
		agent.WaitState(t, "default/"+name, "offline", wait)
		e := agent.WaitDeviceError(t, "default", name, "int32", wait)
		if !strings.Contains(e, refusal) {
			t.Errorf("%s: error %q does not carry the server's refusal", name, e)
		}
		t.Logf("%s: %s", name, e)
		if tws := agent.Twins("default/"+name, "int32", 0); len(tws) != 0 {
			t.Errorf("%s: %d values reported through a refused session", name, len(tws))
		}
	}

	// The right session writes too: read back by another (user-name) client.
	want := 7000 + time.Now().Nanosecond()%1000
	from := agent.ReportCount()
	if _, err := agent.Mapper(t).UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: mappertest.SetDesired(right, "int32", strconv.Itoa(want))}); err != nil {
		t.Fatal(err)
	}
	agent.WaitReported(t, "default/right", "int32", strconv.Itoa(want), from, wait)
	if got := readAs(t, endpoint, "ns=2;s=Static_Scalar_Int32", "plant", "s3cret-Pw"); got != int32(want) {
		t.Errorf("another client reads %v, want %d", got, want)
	}
}

// readAs reads a node's value on a session of its own as a user.
func readAs(t *testing.T, endpoint, node, user, password string) any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	eps, err := opcua.GetEndpoints(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := opcua.SelectEndpoint(eps, "None", ua.MessageSecurityModeNone)
	if err != nil {
		t.Fatal(err)
	}
	c, err := opcua.NewClient(endpoint, opcua.SecurityFromEndpoint(ep, ua.UserTokenTypeUserName), opcua.AuthUsername(user, password))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	resp, err := c.Read(ctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.MustParseNodeID(node), AttributeID: ua.AttributeIDValue}}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Results[0].Status != ua.StatusOK {
		t.Fatalf("reading %s: %v", node, resp.Results[0].Status)
	}
	return resp.Results[0].Value.Value()
}

// A refused login fails safe (node-opcua's userManager, a wrong password
// in a mounted-Secret-like file): the mapper tries again with a backoff
// that doubles up to AuthRetryMax, not at the reconnect pace (timed by the
// server's own clock: the gaps between its checks grow to the ceiling, 8
// times ReconnectMax here, where the old pace kept them at ReconnectMax);
// the device is offline and Authenticated is False with the server's
// words; the right password written to the file brings it back at once
// (the retry counted as the credentials', not the backoff's). Parallel
// with the other peer tests: most of its time is waiting.
func TestOPCUAMapperBacksOffRefusedLogins(t *testing.T) {
	t.Parallel()
	_, server, endpoint := startServerWith(t, map[string]any{"users": []map[string]string{{"user": "plant", "password": "s3cret-Pw"}}})
	secrets := t.TempDir()
	userFile, passFile := filepath.Join(secrets, "username"), filepath.Join(secrets, "password")
	writeSecret := func(path, v string) {
		t.Helper()
		// As the kubelet updates a mounted Secret: a new file renamed over.
		if err := os.WriteFile(path+".tmp", []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	writeSecret(userFile, "plant")
	writeSecret(passFile, "guess")
	props := []mappertest.Prop{{Name: "int32", Visitor: map[string]any{"nodeId": "ns=2;s=Static_Scalar_Int32"}, CollectCycle: 100 * time.Millisecond}}
	locked := mappertest.NewDevice(t, "default", "locked", "opcua-sim", mopcua.Protocol,
		map[string]any{"endpoint": endpoint, "timeout": "3s", "usernameFile": userFile, "passwordFile": passFile}, props...)

	const (
		reconnectMax = 250 * time.Millisecond
		authInitial  = 250 * time.Millisecond
		authMax      = 8 * reconnectMax
	)
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, []*dmiv1beta1.Device{locked})
	metrics := mapper.NewMetrics()
	mappertest.RunMapper(t, mapper.Config{Protocol: mopcua.Protocol, StateDir: dir, NewDriver: mopcua.NewDriver, Logger: testr.New(t), Metrics: metrics,
		ReconnectInitial: 50 * time.Millisecond, ReconnectMax: reconnectMax, AuthRetryInitial: authInitial, AuthRetryMax: authMax,
		CredentialPoll: 50 * time.Millisecond, ReregisterInterval: time.Hour, CallTimeout: 10 * time.Second})

	// Seven refused checks: six gaps, the last two at the ceiling.
	var at []int64
	from := 0
	for len(at) < 7 {
		var rest string
		rest, from = server.WaitLine(t, "AUTH plant refused", from, 3*authMax+wait)
		ms, err := strconv.ParseInt(strings.TrimPrefix(rest, "at="), 10, 64)
		if err != nil {
			t.Fatalf("AUTH line %q: %v", rest, err)
		}
		at = append(at, ms)
	}
	// Right after a refusal the next try is a whole ceiling away: the fix
	// must not wait for it.
	writeSecret(passFile, "s3cret-Pw")
	var gaps []time.Duration
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, time.Duration(at[i]-at[i-1])*time.Millisecond)
	}
	t.Logf("gaps between refused logins: %v (reconnect pace %v, auth backoff %v up to %v)", gaps, reconnectMax, authInitial, authMax)
	for i, g := range gaps {
		// Timers fire late, never early: a gap is at least its wait.
		want := min(authInitial<<i, authMax)
		if g < want*9/10 {
			t.Errorf("gap %d is %v, want at least %v (backoff %v doubling to %v)", i, g, want*9/10, authInitial, authMax)
		}
	}
	if last := gaps[len(gaps)-1]; last < 7*reconnectMax {
		t.Errorf("at the ceiling a refused login is retried after %v, %.1f times the reconnect pace %v; want about %d times", last,
			float64(last)/float64(reconnectMax), reconnectMax, authMax/reconnectMax)
	}

	agent.WaitState(t, "default/locked", "offline", wait)
	c := agent.WaitCondition(t, "default/locked", "Authenticated", false, wait)
	if c.Reason != "AuthFailed" || !strings.Contains(c.Message, "BadUserAccessDenied") {
		t.Errorf("Authenticated condition %+v: want AuthFailed with the server's BadUserAccessDenied", c)
	}

	// The fixed Secret: signed in without waiting out the backoff.
	server.WaitLine(t, "AUTH plant ok", from, wait)
	agent.WaitState(t, "default/locked", "ok", wait)
	agent.WaitCondition(t, "default/locked", "Authenticated", true, wait)
	agent.WaitTwin(t, "default/locked", "int32", 0, wait, func(tw *dmiv1beta1.Twin) bool {
		_, err := strconv.Atoi(tw.GetReported().GetValue())
		return err == nil
	})
	if n := metrics.Value("dowse_mapper_auth_retries_total", `trigger="credentials"`); n != 1 {
		t.Errorf("sign-ins retried for changed credentials: %v, want 1 (the fix was not waited out)", n)
	}
	if n := metrics.Value("dowse_mapper_auth_retries_total", `trigger="backoff"`); n != float64(len(at)-1) {
		t.Errorf("sign-ins retried after the backoff: %v, want %d", n, len(at)-1)
	}
}
