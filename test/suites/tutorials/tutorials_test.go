package tutorials

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/kubeedgepeer"
)

// tutorials are docs/tutorials' pages in the order the site lists them;
// they share one cluster, each in a folder of its own, and each leaves
// nothing behind that the next one would trip over.
var tutorials = []string{
	"first-device.md",
	"write-a-handler.md",
	"write-a-mapper.md",
	"from-akri.md",
	"from-kubeedge.md",
}

// blockTimeout bounds one block: the slowest builds a Go program cold.
const blockTimeout = 4 * time.Minute

func TestEveryTutorialIsRun(t *testing.T) {
	dir := filepath.Join(kube.RepoRoot(), "docs", "tutorials")
	pages, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, p := range tutorials {
		listed[p] = true
	}
	for _, p := range pages {
		if name := filepath.Base(p); name != "index.md" && !listed[name] {
			t.Errorf("docs/tutorials/%s is not in this suite's list of tutorials: its commands would never run", name)
		}
	}
	for _, name := range tutorials {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := Parse(string(raw))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		checks := 0
		for _, b := range blocks {
			if b.Kind == BlockRun && (len(b.Expect) > 0 || strings.Contains(b.Text, "kubectl wait")) {
				checks++
			}
		}
		if checks == 0 {
			t.Errorf("%s: no block says what it reaches (a ```text block after it, or kubectl wait)", name)
		}
	}
}

func TestParse(t *testing.T) {
	md := "Intro\n\n```sh\necho hi\n```\n\nIt prints:\n\n```text\nhi   there\n```\n\n" +
		"<!-- file: a/b.go -->\n```go\npackage b\n```\n\n```yaml\nshown: yes\n```\n\n```text\nnot an expectation\n```\n"
	blocks, err := Parse(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 4 || blocks[0].Kind != BlockRun || blocks[0].Text != "echo hi\n" || len(blocks[0].Expect) != 1 || blocks[0].Expect[0] != "hi there" ||
		blocks[1].Kind != BlockFile || blocks[1].Path != "a/b.go" || blocks[2].Kind != BlockShown || blocks[3].Kind != BlockShown {
		t.Errorf("blocks %+v", blocks)
	}
	for _, bad := range []string{"```bash\nls\n```\n", "1. step\n\n    ```sh\n    ls\n    ```\n", "```sh\nls\n"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) took it", bad)
		}
	}
	if m := Missing("a 1\nb  2\nc 3\n", []string{"a 1", "c 3"}); m != "" {
		t.Errorf("Missing: %q", m)
	}
	if m := Missing("a 1\nb 2\n", []string{"b 2", "a 1"}); m != "a 1" {
		t.Errorf("Missing out of order: %q", m)
	}
}

// TestTutorials runs every tutorial's commands against one demo cluster.
func TestTutorials(t *testing.T) {
	env := startDemo(t)
	for _, name := range tutorials {
		t.Run(strings.TrimSuffix(name, ".md"), func(t *testing.T) {
			if name == "from-kubeedge.md" {
				// The tutorial builds the peer itself; this says why it
				// cannot (no module proxy) the way the other suites do.
				kubeedgepeer.Build(t, t.TempDir(), kubeedgepeer.V123)
			}
			start := time.Now()
			runTutorial(t, env, filepath.Join(kube.RepoRoot(), "docs", "tutorials", name))
			t.Logf("%s ran in %s", name, time.Since(start).Round(100*time.Millisecond))
		})
	}
}

// startDemo runs hack/demo --tutorial in a folder of the test's until the
// test ends and returns its env file.
func startDemo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "demo")
	build := exec.Command("go", "build", "-o", bin, "./hack/demo")
	build.Dir = kube.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./hack/demo: %v\n%s", err, out)
	}
	state := filepath.Join(dir, "cluster")
	out := procs.NewLines()
	p, err := procs.Run("demo", bin, []string{"--tutorial", "--dir", state}, procs.Options{Stdout: out, Stderr: out, DieWithCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	out.EndWith(p)
	t.Cleanup(func() {
		// Ctrl-C, as a person stops it: the demo stops what it started.
		_ = syscall.Kill(p.Pid(), syscall.SIGINT)
		select {
		case <-p.Done():
		case <-time.After(30 * time.Second):
			t.Errorf("the demo did not stop within 30 s of SIGINT")
		}
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
		if t.Failed() {
			logs, _ := os.ReadFile(filepath.Join(state, "processes.log"))
			if len(logs) > 256<<10 {
				logs = logs[len(logs)-256<<10:]
			}
			t.Logf("demo output:\n%s\nits processes' logs:\n%s", out, logs)
		}
	})
	env := filepath.Join(state, "env")
	start := time.Now()
	for {
		if _, err := os.Stat(env); err == nil {
			break
		}
		select {
		case <-p.Done():
			t.Fatalf("the demo ended before the cluster was up:\n%s", out)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Since(start) > 3*time.Minute {
			t.Fatalf("the demo did not write %s within 3 minutes:\n%s", env, out)
		}
	}
	t.Logf("the demo's cluster is up in %s", time.Since(start).Round(100*time.Millisecond))
	return env
}

// output collects the shell's output and says when a line arrives.
type output struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	more chan struct{}
}

func (o *output) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(b)
	select {
	case o.more <- struct{}{}:
	default:
	}
	return len(b), nil
}

func (o *output) from(off int) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()[off:]
}

// runTutorial feeds the tutorial's blocks to one bash, as a reader's
// terminal, and checks what each block prints.
func runTutorial(t *testing.T, env, page string) {
	raw, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := Parse(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	work, scripts := t.TempDir(), t.TempDir()
	sh := exec.Command("bash", "--noprofile", "--norc")
	sh.Dir = work
	// Its own process group: the background jobs a tutorial starts are
	// stopped with it.
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out := &output{more: make(chan struct{}, 1)}
	sh.Stdout, sh.Stderr = out, out
	sh.WaitDelay = 5 * time.Second
	stdin, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = sh.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		// Whatever the tutorial left running (it stops its jobs itself;
		// this is for a failed run).
		_ = syscall.Kill(-sh.Process.Pid, syscall.SIGTERM)
		time.Sleep(200 * time.Millisecond)
		_ = syscall.Kill(-sh.Process.Pid, syscall.SIGKILL)
	})
	send := func(s string) {
		if _, err := io.WriteString(stdin, s); err != nil {
			t.Fatalf("writing to the shell: %v\n%s", err, out.from(0))
		}
	}
	send(fmt.Sprintf("set -euo pipefail\nsource %q\n", env))

	for i, b := range blocks {
		if b.Kind == BlockShown {
			continue
		}
		script := filepath.Join(scripts, fmt.Sprintf("block-%d.sh", i))
		text := b.Text
		if b.Kind == BlockFile {
			// Saved where the reader's shell is, as they would.
			text = fmt.Sprintf("mkdir -p \"$(dirname %q)\"\ncat > %q <<'DOWSE_TUTORIAL_FILE_END'\n%sDOWSE_TUTORIAL_FILE_END\n", b.Path, b.Path, b.Text)
		}
		if err := os.WriteFile(script, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		marker := fmt.Sprintf("DOWSE-TUTORIAL-BLOCK-%d-DONE", i)
		off := len(out.from(0))
		// Its standard input is not the rest of the script.
		send(fmt.Sprintf("source %q </dev/null\necho %s\n", script, marker))
		deadline := time.After(blockTimeout)
		for !strings.Contains(out.from(off), marker+"\n") {
			select {
			case <-out.more:
			case <-done:
				if strings.Contains(out.from(off), marker+"\n") {
					continue
				}
				t.Fatalf("%s:%d: the shell ended (a command failed) in\n%s\noutput:\n%s", filepath.Base(page), b.Line, b.Text, out.from(off))
			case <-deadline:
				t.Fatalf("%s:%d: not done within %s:\n%s\noutput:\n%s", filepath.Base(page), b.Line, blockTimeout, b.Text, out.from(off))
			}
		}
		got := strings.TrimSuffix(out.from(off), marker+"\n")
		if m := Missing(got, b.Expect); m != "" {
			t.Fatalf("%s:%d: the output of\n%s\nlacks the line %q (in the order the tutorial shows); it was:\n%s", filepath.Base(page), b.Line, b.Text, m, got)
		}
		t.Logf("%s:%d ok:\n%s", filepath.Base(page), b.Line, got)
	}
}
