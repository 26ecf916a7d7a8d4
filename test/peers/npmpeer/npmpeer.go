// Package npmpeer runs real protocol peers from the npm registry in tests:
// pinned packages that hack/install-npm-peers.sh (run by
// hack/install-deps.sh, so by make test) installs under the repository's
// bin/npm-peers, run through small launcher scripts with node, every
// process stopped when the test ends. Tests never run npm.
//
// When node or a package is missing, a test fails if the environment
// variable CI is "true" (a CI run must not pass by skipping) and is skipped
// otherwise.
package npmpeer

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

// Unavailable fails the test under CI and skips it otherwise, saying how to
// get what is missing.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true, so this fails rather than skips)", msg)
	}
	t.Skipf("%s; skipping (set CI=true to make this a failure)", msg)
}

// Installed returns <repo>/bin/npm-peers/<cache>/node_modules when pkgs
// (name@version) are installed there, and calls Unavailable, naming
// hack/install-npm-peers.sh, when they are not. It never runs npm.
func Installed(t testing.TB, cache string, pkgs ...string) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		Unavailable(t, "node is not on PATH: install Node.js 20 (hack/install-deps.sh)")
	}
	modules := filepath.Join(kube.RepoRoot(), "bin", "npm-peers", cache, "node_modules")
	if !installed(modules, pkgs) {
		Unavailable(t, "npm packages %v are not installed in %s: run hack/install-deps.sh (or hack/install-npm-peers.sh)", pkgs, modules)
	}
	return modules
}

func installed(modules string, pkgs []string) bool {
	for _, p := range pkgs {
		name, version := p, ""
		if i := strings.LastIndexByte(p, '@'); i > 0 {
			name, version = p[:i], p[i+1:]
		}
		b, err := os.ReadFile(filepath.Join(modules, name, "package.json"))
		if err != nil {
			return false
		}
		var meta struct{ Version string }
		if json.Unmarshal(b, &meta) != nil || (version != "" && meta.Version != version) {
			return false
		}
	}
	return true
}

// Process is a running peer.
type Process struct {
	*procs.Proc
	stdout *procs.Lines
}

// Start runs node script args with NODE_PATH=modules and stops it when the
// test ends. Its stdout lines are kept for WaitLine; both streams go to the
// test log.
func Start(t testing.TB, name, modules, script string, args ...string) *Process {
	t.Helper()
	stdout, stderr := procs.NewLines(), procs.NewLines()
	stderr.Each = func(line string) { logf(t, "%s stderr: %s", name, line) }
	p, err := procs.Run(name, "node", append([]string{script}, args...), procs.Options{
		Env: append(os.Environ(), "NODE_PATH="+modules), Stdout: stdout, Stderr: stderr, DieWithCaller: true,
	})
	if err != nil {
		Unavailable(t, "starting node %s: %v", script, err)
	}
	stdout.EndWith(p)
	t.Cleanup(p.Stop)
	return &Process{Proc: p, stdout: stdout}
}

// logf logs unless the test has finished; a peer's late output must not
// panic the test binary.
func logf(t testing.TB, format string, args ...any) {
	defer func() { _ = recover() }()
	t.Logf(format, args...)
}

// WaitLine waits for a stdout line starting with prefix, counting from line
// index from (0 for the first), and returns the rest of the line and the
// index after it.
func (p *Process) WaitLine(t testing.TB, prefix string, from int, timeout time.Duration) (string, int) {
	t.Helper()
	rest, next, err := p.stdout.Wait(prefix, from, timeout)
	if err != nil {
		t.Fatalf("%s %v", p.Name, err)
	}
	return rest, next
}

// TryLine is WaitLine returning an error instead of failing the test.
func (p *Process) TryLine(prefix string, from int, timeout time.Duration) (string, int, error) {
	return p.stdout.Wait(prefix, from, timeout)
}

// Lines returns how many stdout lines the peer has printed.
func (p *Process) Lines() int { return p.stdout.Len() }

// Stop ends the peer by its pid: SIGTERM, then SIGKILL after 5s. It is
// idempotent.
func (p *Process) Stop() { p.StopWithin(5 * time.Second) }

// FreePort returns a TCP port free on host at the time of the call.
func FreePort(t testing.TB, host string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// JSON marshals v for a launcher's argument.
func JSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
