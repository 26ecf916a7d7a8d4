// Package procs runs Dowse's real binaries (from bin/) as child processes for
// benchmarks, end-to-end tests and the demo, and stops them by process id.
package procs

import (
	"bufio"
	"errors"
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
func (p *Proc) PeakRSS() (int, error) { return PeakRSSOf(p.Pid()) }

// PeakRSSOf is process pid's peak resident set (VmHWM) in KiB.
func PeakRSSOf(pid int) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
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
	return 0, fmt.Errorf("no VmHWM for process %d", pid)
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

// CPUTime is the CPU time (user and system) process pid has used.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after it
	// follow its closing parenthesis: utime and stime are the 14th and
	// 15th fields, in clock ticks (USER_HZ, 100 on Linux).
	rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	return time.Duration(u+s) * 10 * time.Millisecond, nil
}

// Child finds the process id of this process's child whose command is
// comm (a binary a library started, such as envtest's kube-apiserver).
func Child(comm string) (int, error) {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || s[open+1:end] != comm {
			continue
		}
		f := strings.Fields(s[end+2:])
		if len(f) > 1 && f[1] == strconv.Itoa(os.Getpid()) {
			return strconv.Atoi(strings.Fields(s)[0])
		}
	}
	return 0, fmt.Errorf("no child process %s", comm)
}

// MachineCPU is the machine's CPU time so far, busy and in all, summed
// over its CPUs (the first line of /proc/stat).
func MachineCPU() (busy, total time.Duration, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, errors.New("unreadable /proc/stat")
	}
	var ticks [10]int64
	for i := 1; i < len(f) && i <= len(ticks); i++ {
		ticks[i-1], _ = strconv.ParseInt(f[i], 10, 64)
	}
	var all int64
	for _, t := range ticks[:8] { // guest time is counted in user already
		all += t
	}
	idle := ticks[3] + ticks[4] // idle, iowait
	return time.Duration(all-idle) * 10 * time.Millisecond, time.Duration(all) * 10 * time.Millisecond, nil
}
