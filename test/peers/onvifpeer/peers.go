//go:build linux

package onvifpeer

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Go2rtcEnv names the go2rtc v1.9.13 binary the tests run as a real ONVIF
// device service (hack/build-go2rtc.sh builds bin/peers/go2rtc).
const Go2rtcEnv = "DOWSE_GO2RTC"

// Unavailable fails (CI=true) or skips a test whose peer is missing.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format+" (CI=true: a missing prerequisite fails)", args...)
	}
	t.Skipf(format, args...)
}

// Go2rtcBinary is the go2rtc binary, or the test is skipped (failed in CI).
func Go2rtcBinary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv(Go2rtcEnv)
	if bin == "" {
		_, file, _, _ := runtime.Caller(0)
		bin = filepath.Join(filepath.Dir(file), "..", "..", "..", "bin", "peers", "go2rtc")
	}
	if _, err := os.Stat(bin); err != nil {
		Unavailable(t, "needs go2rtc v1.9.13 at %s: run hack/build-go2rtc.sh (make peers) or set %s", bin, Go2rtcEnv)
	}
	return bin
}

// syncBuffer is a peer's output, written while a test may read it.
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

// startIn runs a command in netns ns (the host's when ""), logs its output
// when the test failed and stops it (SIGTERM, then SIGKILL) by pid when the
// test ends; it returns once addr accepts connections.
func startIn(t testing.TB, ns, name, addr string, args ...string) {
	t.Helper()
	bin, args := args[0], args[1:]
	if ns != "" {
		bin, args = "ip", append([]string{"netns", "exec", ns, bin}, args...)
	}
	var out syncBuffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		dial := func() {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
			}
		}
		if ns != "" {
			InNetns(t, ns, dial)
		} else {
			dial()
		}
		if err == nil {
			return
		}
		select {
		case <-done:
			t.Fatalf("%s exited: %s", name, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not listening on %s: %v\n%s", name, addr, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StartGo2rtc runs go2rtc in netns ns with its API (and ONVIF device
// service) on apiAddr and RTSP on rtspAddr, with api settings (indented
// lines under api:) added, until the test ends.
func StartGo2rtc(t testing.TB, ns, apiAddr, rtspAddr, api string) {
	t.Helper()
	bin := Go2rtcBinary(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "go2rtc.yaml")
	// Port 80 is avoided: go2rtc answers 500 when the Host has no port.
	body := fmt.Sprintf("api:\n  listen: %q\n%srtsp:\n  listen: %q\nwebrtc:\n  listen: \"\"\nstreams:\n  gate: exec:true\n", apiAddr, api, rtspAddr)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	startIn(t, ns, "go2rtc", apiAddr, bin, "-config", cfg)
}

// LighttpdBinary is Debian's lighttpd, or the test is skipped (failed in CI).
func LighttpdBinary(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"/usr/sbin/lighttpd", "/usr/bin/lighttpd"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("lighttpd"); err == nil {
		return p
	}
	Unavailable(t, "needs Debian's lighttpd (hack/install-deps.sh: apt-get install lighttpd)")
	return ""
}

// StartDigestProxy runs lighttpd in netns ns on listen (host:port) as a
// reverse proxy to backend (host:port) that requires HTTP Digest
// authentication (RFC 7616, MD5, qop auth) of user with password, as a
// camera that insists on Digest does, until the test ends.
func StartDigestProxy(t testing.TB, ns, listen, backend, user, password string) {
	t.Helper()
	bin := LighttpdBinary(t)
	dir := t.TempDir()
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatal(err)
	}
	bhost, bport, err := net.SplitHostPort(backend)
	if err != nil {
		t.Fatal(err)
	}
	const realm = "dowse-camera"
	sum := md5.Sum([]byte(user + ":" + realm + ":" + password))
	if err := os.WriteFile(filepath.Join(dir, "htdigest"), []byte(user+":"+realm+":"+hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`server.modules = ("mod_auth", "mod_authn_file", "mod_proxy")
server.document-root = %[1]q
server.bind = %[2]q
server.port = %[3]s
server.errorlog = %[4]q
server.pid-file = %[5]q
auth.backend = "htdigest"
auth.backend.htdigest.userfile = %[6]q
auth.require = ("/" => ("method" => "digest", "realm" => %[7]q, "require" => "valid-user"))
proxy.server = ("" => (("host" => %[8]q, "port" => %[9]s)))
`, dir, host, port, filepath.Join(dir, "error.log"), filepath.Join(dir, "lighttpd.pid"), filepath.Join(dir, "htdigest"), realm, bhost, bport)
	if err := os.WriteFile(filepath.Join(dir, "lighttpd.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	startIn(t, ns, "lighttpd", listen, bin, "-D", "-f", filepath.Join(dir, "lighttpd.conf"))
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("lighttpd error log:\n%s", b)
		}
	})
}
