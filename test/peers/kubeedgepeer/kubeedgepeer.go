// Package kubeedgepeer builds and runs test/peers/kubeedge-mapper, a mapper
// on KubeEdge's own mapper-framework runtime, against an agent's dmi.sock:
// the proof that a mapper written for edgecore works with Dowse unchanged.
// That mapper is a module of its own (KubeEdge's DMI package and Dowse's
// register the same protobuf names), so it is built with `go build` in its
// folder rather than linked into a test.
package kubeedgepeer

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// The mapper-framework versions the mapper is built on: each names its
// module file in test/peers/kubeedge-mapper (the same source builds on
// both).
const (
	V121 = "v1.21.0"
	V123 = "v1.23.0"
)

// Versions are all of them, oldest first.
var Versions = []string{V121, V123}

var modFiles = map[string]string{V121: "go.mod", V123: "go.1.23.mod"}

// Build builds the mapper on mapper-framework version into dir and returns
// its path. Without the mapper-framework modules (no module proxy) the
// test is skipped, or failed under CI.
func Build(t testing.TB, dir, version string) string {
	t.Helper()
	modFile, ok := modFiles[version]
	if !ok {
		t.Fatalf("no KubeEdge mapper peer for mapper-framework %s", version)
	}
	bin := filepath.Join(dir, "kubeedge-mapper-"+version)
	cmd := exec.Command("go", "build", "-modfile="+modFile, "-o", bin, ".")
	cmd.Dir = filepath.Join(kube.RepoRoot(), "test", "peers", "kubeedge-mapper")
	if out, err := cmd.CombinedOutput(); err != nil {
		npmpeer.Unavailable(t, "cannot build the KubeEdge mapper-framework %s test peer (%v): %s; it needs "+
			"github.com/kubeedge/mapper-framework and github.com/kubeedge/api %s in the module cache: "+
			"run `cd test/peers/kubeedge-mapper && go mod download -modfile=%s` with the Go module proxy reachable", version, err, out, version, modFile)
	}
	return bin
}

// Objects returns the YAML stream of KubeEdge 1.23 DeviceModels, Devices
// and DeviceStatuses that test/peers/kubeedge-mapper/objects builds from
// KubeEdge's own v1beta1 Go types.
func Objects(t testing.TB) []byte {
	t.Helper()
	cmd := exec.Command("go", "run", "-modfile="+modFiles[V123], "./objects")
	cmd.Dir = filepath.Join(kube.RepoRoot(), "test", "peers", "kubeedge-mapper")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		npmpeer.Unavailable(t, "cannot build KubeEdge's objects from github.com/kubeedge/api %s (%v): %s; "+
			"run `cd test/peers/kubeedge-mapper && go mod download -modfile=%s` with the Go module proxy reachable", V123, err, stderr.String(), modFiles[V123])
	}
	return out
}

// Mapper is a running mapper. Out holds its EVENT lines (see its main.go),
// each with the time it came; Stderr its log.
type Mapper struct {
	*procs.Proc
	Out, Stderr *procs.Lines
}

// Start runs bin, registering with the agent at dmiSock, with its
// configuration and socket in dir (a restarted mapper given the same dir
// is the same mapper to the agent). It is killed when t ends, and its
// output logged if t failed.
func Start(t testing.TB, bin, dir, dmiSock string) *Mapper {
	t.Helper()
	cfg := filepath.Join(dir, "config.yaml")
	yaml := fmt.Sprintf("grpc_server:\n  socket_path: %s\ncommon:\n  name: virtual-mapper\n  version: v1.0.0\n  api_version: v1.0.0\n  protocol: virtual\n  address: 127.0.0.1\n  edgecore_sock: %s\n",
		filepath.Join(dir, "mapper.sock"), dmiSock)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	m := &Mapper{Out: procs.NewLines(), Stderr: procs.NewLines()}
	p, err := procs.Run("kubeedge-mapper", bin, []string{"--config-file", cfg, "--v", "1"},
		procs.Options{Stdout: m.Out, Stderr: m.Stderr, DieWithCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	m.Proc = p
	m.Out.EndWith(p)
	m.Stderr.EndWith(p)
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("kubeedge mapper events:\n%s\nstderr:\n%s", m.Out, m.Stderr)
		}
	})
	return m
}
