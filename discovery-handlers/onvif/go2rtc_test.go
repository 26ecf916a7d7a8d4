//go:build linux

package onvif

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	peertest "github.com/dowse-dev/dowse/test/peers/onvifpeer"
)

// Go2rtcEnv names the go2rtc v1.9.13 binary the test runs as a real ONVIF
// device service (built from the module after deleting its two .c
// generator files).
const Go2rtcEnv = "DOWSE_GO2RTC"

// TestHandlerGo2rtc finds a camera whose WS-Discovery names go2rtc's ONVIF
// device service, in a namespace of the test's, and reads from go2rtc its
// device information and the stream URI of its first profile.
func TestHandlerGo2rtc(t *testing.T) {
	bin := os.Getenv(Go2rtcEnv)
	if bin == "" {
		// hack/build-go2rtc.sh (run by `make test`) puts it here.
		_, file, _, _ := runtime.Caller(0)
		bin = filepath.Join(filepath.Dir(file), "..", "..", "bin", "peers", "go2rtc")
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("needs go2rtc v1.9.13 at %s: run hack/build-go2rtc.sh or set %s (CI=true: a missing prerequisite fails)", bin, Go2rtcEnv)
		}
		t.Skipf("needs go2rtc v1.9.13 at %s: run hack/build-go2rtc.sh or set %s", bin, Go2rtcEnv)
	}
	ns, local, peerIf, peerAddr := peertest.PeerNet(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "go2rtc.yaml")
	// Port 80 is avoided: go2rtc answers 500 when the Host has no port.
	if err := os.WriteFile(cfg, []byte("api:\n  listen: \":1984\"\nrtsp:\n  listen: \":8554\"\nwebrtc:\n  listen: \"\"\nstreams:\n  gate: exec:true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command("ip", "netns", "exec", ns, bin, "-config", cfg)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("go2rtc output:\n%s", out.String())
		}
	})
	service := fmt.Sprintf("http://%s:1984/onvif/device_service", peerAddr)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", peerAddr.String()+":1984", time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("go2rtc not listening: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	const uuid = "60260000-0000-4000-8000-000000000260"
	peertest.StartCamera(t, ns, peerIf, &peertest.Camera{UUID: uuid, Addr: peerAddr.String(), AnnounceXAddr: service})

	reg := runHandler(t)
	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(`{"interfaces": [%q], "probeInterval": "60s"}`, local.Name)})
	devs, _ := waitIDs(t, s, 10*time.Second, uuid)
	p := devs[0].Properties
	if p[DeviceServiceURLProperty] != service || p[StreamURIProperty] != fmt.Sprintf("rtsp://%s:8554/gate", peerAddr) {
		t.Errorf("properties %v", p)
	}
	t.Logf("go2rtc camera: %v", p)
}

// TestHandlerDigestCamera: a camera that insists on HTTP Digest (go2rtc
// behind Debian's lighttpd, which requires Digest of every request, in a
// namespace of the test's) is found with the right credentials, device
// information and stream URI read through the proxy; with a wrong password
// it is skipped, and the stream's skipped candidates say why.
func TestHandlerDigestCamera(t *testing.T) {
	ns, local, peerIf, peerAddr := peertest.PeerNet(t)
	peertest.StartGo2rtc(t, ns, "127.0.0.1:1984", peerAddr.String()+":8554", "")
	proxy := peerAddr.String() + ":8080"
	peertest.StartDigestProxy(t, ns, proxy, "127.0.0.1:1984", "plant", "s3cret-Pw")
	service := "http://" + proxy + "/onvif/device_service"
	const uuid = "60260000-0000-4000-8000-00000000d16e"
	peertest.StartCamera(t, ns, peerIf, &peertest.Camera{UUID: uuid, Addr: peerAddr.String(), AnnounceXAddr: service})

	reg := runHandler(t)
	details := fmt.Sprintf(`{"interfaces": [%q], "probeInterval": "60s"}`, local.Name)
	props := func(pw string) map[string]*discoveryv1.ByteData {
		return map[string]*discoveryv1.ByteData{UsernameProperty: {Vec: []byte("plant")}, PasswordProperty: {Vec: []byte(pw)}}
	}
	right := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: details, DiscoveryProperties: props("s3cret-Pw")})
	wrong := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: details, DiscoveryProperties: props("guess")})

	devs, _ := waitIDs(t, right, 10*time.Second, uuid)
	if p := devs[0].Properties; p[DeviceServiceURLProperty] != service || p[StreamURIProperty] == "" {
		t.Errorf("Digest camera's properties %v", p)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := wrong.NextResponse(t, time.Until(deadline))
		if len(resp.GetDevices()) != 0 {
			t.Fatalf("a wrong password listed %v", resp.GetDevices())
		}
		if sk := resp.GetSkipped(); len(sk) == 1 && sk[0].GetReason() == SkipAuthRefused {
			c := sk[0].GetCandidates()
			if len(c) != 1 || c[0].GetCandidate() != service || !strings.Contains(c[0].GetMessage(), "401") {
				t.Fatalf("AuthRefused names %v, want %s and the camera's 401", c, service)
			}
			t.Logf("skipped: %s: %s", c[0].GetCandidate(), c[0].GetMessage())
			return
		}
	}
}
