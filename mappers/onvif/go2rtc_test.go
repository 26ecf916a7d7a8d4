package onvif_test

import (
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	"github.com/dowse-dev/dowse/mappers/onvif"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

const wait = 15 * time.Second

// go2rtc runs go2rtc v1.9.13 (hack/build-go2rtc.sh, or $DOWSE_GO2RTC) on
// loopback as the camera; start starts it again on the same ports.
type go2rtc struct {
	t          *testing.T
	bin, dir   string
	api, rtsp  int
	cmd        *exec.Cmd
	out        syncBuffer
	done       chan struct{}
	serviceURL string
}

// syncBuffer is go2rtc's output, read by the test while go2rtc writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func (b *syncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.Reset()
}

func startGo2rtc(t *testing.T) *go2rtc {
	t.Helper()
	return startGo2rtcWith(t, "", "")
}

// startGo2rtcWith adds api settings (indented lines under api:) and
// top-level settings to go2rtc's config.
func startGo2rtcWith(t *testing.T, api, top string) *go2rtc {
	t.Helper()
	bin := os.Getenv("DOWSE_GO2RTC")
	if bin == "" {
		_, file, _, _ := runtime.Caller(0)
		bin = filepath.Join(filepath.Dir(file), "..", "..", "bin", "peers", "go2rtc")
	}
	if _, err := os.Stat(bin); err != nil {
		npmpeer.Unavailable(t, "needs go2rtc v1.9.13 at %s: run hack/build-go2rtc.sh (make peers) or set DOWSE_GO2RTC", bin)
	}
	g := &go2rtc{t: t, bin: bin, dir: t.TempDir(), api: npmpeer.FreePort(t, "127.0.0.1"), rtsp: npmpeer.FreePort(t, "127.0.0.1")}
	g.serviceURL = fmt.Sprintf("http://127.0.0.1:%d/onvif/device_service", g.api)
	cfg := fmt.Sprintf("api:\n  listen: \"127.0.0.1:%d\"\n%srtsp:\n  listen: \"127.0.0.1:%d\"\nwebrtc:\n  listen: \"\"\nstreams:\n  gate: exec:true\n  yard: exec:true\n%s", g.api, api, g.rtsp, top)
	if err := os.WriteFile(filepath.Join(g.dir, "go2rtc.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	g.start()
	t.Cleanup(g.stop)
	return g
}

func (g *go2rtc) start() {
	g.t.Helper()
	g.out.Reset()
	g.cmd = exec.Command(g.bin, "-config", filepath.Join(g.dir, "go2rtc.yaml"))
	g.cmd.Dir = g.dir
	g.cmd.Stdout, g.cmd.Stderr = &g.out, &g.out
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := g.cmd.Start(); err != nil {
		g.t.Fatal(err)
	}
	g.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(g.cmd, g.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(g.api), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("go2rtc not listening: %v\n%s", err, g.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends go2rtc by its pid.
func (g *go2rtc) stop() {
	select {
	case <-g.done:
		return
	default:
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(5 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}

var model = mappertest.NewModel("default", "camera",
	mappertest.ModelProp("manufacturer", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("model", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("firmware", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("stream", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("yardStream", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("snapshot", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("profiles", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("clock", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("bogus", "STRING", "ReadWrite", "", ""),
)

func TestONVIFMapperAgainstGo2rtc(t *testing.T) {
	cam := startGo2rtc(t)
	cycle := 200 * time.Millisecond
	prop := func(name string, v map[string]any) mappertest.Prop {
		return mappertest.Prop{Name: name, Visitor: v, CollectCycle: cycle}
	}
	dev := mappertest.NewDevice(t, "default", "cam", "camera", onvif.Protocol,
		// go2rtc's ONVIF service checks no WS-Security: any credentials
		// do here (TestONVIFCredentials has a camera that checks).
		map[string]any{"deviceServiceUrl": cam.serviceURL, "username": "admin", "password": "secret", "timeout": "2s"},
		prop("manufacturer", map[string]any{"field": "manufacturer"}),
		prop("model", map[string]any{"field": "model"}),
		prop("firmware", map[string]any{"field": "firmwareVersion"}),
		prop("stream", map[string]any{"field": "streamUri"}),
		prop("yardStream", map[string]any{"field": "streamUri", "profileToken": "yard"}),
		prop("snapshot", map[string]any{"field": "snapshotUri"}),
		prop("profiles", map[string]any{"field": "profiles"}),
		prop("clock", map[string]any{"field": "systemDateTime"}),
		prop("bogus", map[string]any{"field": "zoom"}),
	)
	wrongPath := mappertest.NewDevice(t, "default", "wrong-path", "camera", onvif.Protocol,
		map[string]any{"deviceServiceUrl": fmt.Sprintf("http://127.0.0.1:%d/not/onvif", cam.api), "timeout": "2s"},
		prop("model", map[string]any{"field": "model"}))

	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, []*dmiv1beta1.Device{dev, wrongPath})
	mappertest.RunMapper(t, mapper.Config{Protocol: onvif.Protocol, StateDir: dir, NewDriver: onvif.NewDriver, Logger: testr.New(t),
		ReconnectInitial: 100 * time.Millisecond, ReconnectMax: 500 * time.Millisecond, ReregisterInterval: time.Hour})
	ctx := t.Context()

	const d = "default/cam"
	agent.WaitState(t, d, "ok", wait)
	agent.WaitReported(t, d, "model", "go2rtc", 0, wait)
	// go2rtc lists its streams' profiles in no fixed order.
	tw, _ := agent.WaitTwin(t, d, "profiles", 0, wait, func(tw *dmiv1beta1.Twin) bool { return tw.GetReported().GetValue() != "" })
	profiles := strings.Split(tw.GetReported().GetValue(), ",")
	if slices.Sort(profiles); !slices.Equal(profiles, []string{"gate", "yard"}) {
		t.Errorf("profiles = %q, want gate and yard", tw.GetReported().GetValue())
	}
	// streamUri is the first profile's (gate or yard, as go2rtc lists
	// them at the time); yardStream names its profile.
	rtspPrefix := fmt.Sprintf("rtsp://127.0.0.1:%d/", cam.rtsp)
	for prop, want := range map[string][]string{"stream": {"gate", "yard"}, "yardStream": {"yard"}} {
		tw, _ := agent.WaitTwin(t, d, prop, 0, wait, func(tw *dmiv1beta1.Twin) bool { return tw.GetReported().GetValue() != "" })
		v := tw.GetReported().GetValue()
		if !strings.HasPrefix(v, rtspPrefix) || !slices.Contains(want, strings.TrimPrefix(v, rtspPrefix)) {
			t.Errorf("%s = %q, want %s followed by one of %v", prop, v, rtspPrefix, want)
		}
	}
	tw, _ = agent.WaitTwin(t, d, "snapshot", 0, wait, func(tw *dmiv1beta1.Twin) bool { return tw.GetReported().GetValue() != "" })
	t.Logf("snapshot URI: %s", tw.GetReported().GetValue())
	tw, _ = agent.WaitTwin(t, d, "clock", 0, wait, func(tw *dmiv1beta1.Twin) bool { return tw.GetReported().GetValue() != "" })
	clock, err := time.Parse(time.RFC3339, tw.GetReported().GetValue())
	if err != nil || time.Since(clock).Abs() > time.Minute {
		t.Errorf("camera clock %q (%v), want about now", tw.GetReported().GetValue(), err)
	}
	t.Logf("unknown field: %s", agent.WaitDeviceError(t, "default", "cam", "bogus", wait))
	// A wrong device service path: offline, and the reason in the twins.
	agent.WaitState(t, "default/wrong-path", "offline", wait)
	if e := agent.WaitDeviceError(t, "default", "wrong-path", "model", wait); !strings.Contains(e, "HTTP 404") {
		t.Errorf("wrong device service path: %q", e)
	} else {
		t.Logf("wrong device service path: %s", e)
	}

	// A desired value: refused (read-only), shown as such.
	if _, err := agent.Mapper(t).UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: mappertest.SetDesired(dev, "bogus", "x")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(wait)
	for agent.DeviceTwin(t, "default", "cam", "bogus").GetReported().GetMetadata()[twinvalue.MetaDesiredError] == "" {
		if time.Now().After(deadline) {
			t.Fatal("no desiredError for a desired value on a read-only property")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The camera goes away and comes back.
	cam.stop()
	agent.WaitState(t, d, "offline", wait)
	cam.start()
	agent.WaitState(t, d, "ok", wait)
}

// Credentials against go2rtc. Its ONVIF service checks no WS-Security
// token (it takes any), but its API, /onvif/ included, can demand HTTP
// Basic authentication (api username, password, local_auth), as cameras
// that ask for HTTP authentication instead of WS-Security do: the right
// password reads, a wrong one or none is refused with the camera's 401. The
// UsernameToken the mapper sends is read from go2rtc's own log of the
// requests it received and checked as a camera that verifies WS-Security
// would: SHA-1 of nonce, created and the password it knows (go2rtc itself
// does not check it).
func TestONVIFCredentials(t *testing.T) {
	cam := startGo2rtcWith(t, "  username: \"plant\"\n  password: \"s3cret-Pw\"\n  local_auth: true\n", "log:\n  level: info\n  onvif: trace\n")
	prop := mappertest.Prop{Name: "model", Visitor: map[string]any{"field": "model"}, CollectCycle: 200 * time.Millisecond}
	device := func(name string, creds map[string]any) *dmiv1beta1.Device {
		creds["deviceServiceUrl"], creds["timeout"] = cam.serviceURL, "2s"
		return mappertest.NewDevice(t, "default", name, "camera", onvif.Protocol, creds, prop)
	}
	devs := []*dmiv1beta1.Device{
		device("right", map[string]any{"username": "plant", "password": "s3cret-Pw"}),
		device("wrong", map[string]any{"username": "plant", "password": "guess"}),
		device("none", map[string]any{}),
	}
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, devs)
	mappertest.RunMapper(t, mapper.Config{Protocol: onvif.Protocol, StateDir: dir, NewDriver: onvif.NewDriver, Logger: testr.New(t),
		ReconnectInitial: 100 * time.Millisecond, ReconnectMax: time.Second, ReregisterInterval: time.Hour})

	agent.WaitState(t, "default/right", "ok", wait)
	agent.WaitReported(t, "default/right", "model", "go2rtc", 0, wait)
	for name, want := range map[string]string{"wrong": `refused the credentials of user "plant"`, "none": "wants credentials"} {
		agent.WaitState(t, "default/"+name, "offline", wait)
		if e := agent.WaitDeviceError(t, "default", name, "model", wait); !strings.Contains(e, "HTTP 401") || !strings.Contains(e, want) {
			t.Errorf("%s: error %q, want the camera's 401 (%s)", name, e, want)
		} else {
			t.Logf("%s: %s", name, e)
		}
		if tws := agent.Twins("default/"+name, "model", 0); len(tws) != 0 {
			t.Errorf("%s: %d values reported without the camera's consent", name, len(tws))
		}
	}
	// A refused login (credentials given) shows as Authenticated False in
	// the camera's words, and is retried with backoff; the right one is
	// True; none given is no sign-in at all.
	if c := agent.WaitCondition(t, "default/wrong", "Authenticated", false, wait); c.Reason != "AuthFailed" || !strings.Contains(c.Message, "HTTP 401") {
		t.Errorf("wrong: Authenticated %+v, want AuthFailed with the camera's 401", c)
	}
	agent.WaitCondition(t, "default/right", "Authenticated", true, wait)
	for _, c := range agent.Conditions() {
		if c.Device == "none" {
			t.Errorf("none: a condition %+v for a device given no credentials", c)
		}
	}

	// The UsernameTokens go2rtc received (it logs the body of each request
	// that passed its HTTP authentication, so the right device's): each
	// verifies with the camera's password and not with another.
	var toks []usernameToken
	for deadline := time.Now().Add(wait); len(toks) == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		toks = usernameTokens(cam.out.String())
	}
	if len(toks) == 0 {
		t.Fatalf("no UsernameToken in go2rtc's log of the requests it received:\n%s", cam.out.String())
	}
	for _, tok := range toks {
		if tok.user != "plant" || !tok.verifies("s3cret-Pw") || tok.verifies("guess") {
			t.Errorf("token %+v: want user plant, verifying with the camera's password only", tok)
		}
	}
	t.Logf("%d UsernameTokens received by go2rtc verify with the camera's password", len(toks))
}

type usernameToken struct{ user, digest, nonce, created string }

// verifies checks the token as WS-Security's UsernameToken profile says:
// Base64(SHA-1(nonce + created + password)), the nonce Base64 on the wire.
func (u usernameToken) verifies(password string) bool {
	nonce, err := base64.StdEncoding.DecodeString(u.nonce)
	if err != nil || u.created == "" {
		return false
	}
	sum := sha1.Sum(append(append(nonce, u.created...), password...))
	return base64.StdEncoding.EncodeToString(sum[:]) == u.digest
}

// usernameTokens finds the UsernameTokens in go2rtc's log of request bodies.
func usernameTokens(log string) []usernameToken {
	var out []usernameToken
	for _, chunk := range strings.Split(log, "<wsse:UsernameToken>")[1:] {
		end := strings.Index(chunk, "</wsse:UsernameToken>")
		if end < 0 {
			continue
		}
		chunk = chunk[:end]
		text := func(open, close string) string {
			i := strings.Index(chunk, open)
			if i < 0 {
				return ""
			}
			rest := chunk[i+len(open):]
			if j := strings.Index(rest, ">"); j >= 0 && !strings.HasSuffix(open, ">") {
				rest = rest[j+1:]
			}
			if j := strings.Index(rest, close); j >= 0 {
				return rest[:j]
			}
			return ""
		}
		out = append(out, usernameToken{user: text("<wsse:Username>", "</wsse:Username>"), digest: text("<wsse:Password", "</wsse:Password>"),
			nonce: text("<wsse:Nonce", "</wsse:Nonce>"), created: text("<wsu:Created>", "</wsu:Created>")})
	}
	return out
}
