// Package procs runs Dowse's real binaries (from bin/) as child processes for
// benchmarks, end-to-end tests and the demo, and stops them by process id.
package procs

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dowse-dev/dowse/test/kube"
)

// Proc is a running binary.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	done chan struct{}
}

// BinDir is where Start finds binaries: $DOWSE_BIN_DIR when set (a bench
// comparing two builds), else the repository's bin/.
func BinDir() string {
	if d := os.Getenv("DOWSE_BIN_DIR"); d != "" {
		return d
	}
	return filepath.Join(kube.RepoRoot(), "bin")
}

// Start runs <BinDir>/<name> with args, its output going to out.
func Start(name string, out io.Writer, args ...string) (*Proc, error) {
	path := filepath.Join(BinDir(), name)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("%s is missing: run `make build` first", path)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM, then SIGKILL after 10 s, and waits for the exit.
func (p *Proc) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Kill ends the process at once, as a crash would.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Memory is a sample of a process's resident memory, in KiB: Anon is its
// own (heap, stacks), File the pages of its binary and libraries it maps,
// which the page cache shares between processes.
type Memory struct{ RSS, Anon, File int }

// MemoryNow samples the process's resident memory.
func (p *Proc) MemoryNow() (Memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return Memory{}, err
	}
	defer f.Close()
	var m Memory
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.Atoi(fields[1])
		switch fields[0] {
		case "VmRSS:":
			m.RSS = v
		case "RssAnon:":
			m.Anon = v
		case "RssFile:":
			m.File = v
		}
	}
	return m, s.Err()
}

// PeakRSS is the process's peak resident set (VmHWM) in KiB.
func (p *Proc) PeakRSS() (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if strings.HasPrefix(s.Text(), "VmHWM:") {
			return strconv.Atoi(strings.Fields(s.Text())[1])
		}
	}
	return 0, fmt.Errorf("no VmHWM for %s", p.Name)
}

// FreePort returns a loopback TCP port that was free a moment ago, for a
// binary's metrics or probe address.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
