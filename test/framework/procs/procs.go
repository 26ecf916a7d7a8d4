// Package procs runs processes for tests, benchmarks and the demo (Dowse's
// binaries from bin/, peers, a cluster's daemons), keeps their output lines
// for a test to wait on, reads what /proc says of them, and stops them by
// process id.
package procs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/kube"
)

// Proc is a process this package started, or one found again by its
// Record after the process that started it ended (Attach). The start time
// in its Record tells it from a later process that reused its pid, so that
// Stop never signals a stranger.
type Proc struct {
	Record
	cmd  *exec.Cmd
	done chan struct{} // nil when the process is not our child (Attach)
}

// Record is what identifies a process across the processes that handle it:
// a cluster started by one command and stopped by another keeps it on disk.
type Record struct {
	Name      string `json:"name"`
	ID        int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
}

// Options says how Run starts a process.
type Options struct {
	// Env is the whole environment; nil is this process's.
	Env []string
	// Stdout and Stderr receive the output; nil discards it. The process
	// counts as ended only once both are copied.
	Stdout, Stderr io.Writer
	// Stdin is the process's standard input; nil reads nothing. An
	// *os.File (a pipe's read end) is handed over as it is.
	Stdin io.Reader
	// Detach gives the process its own session, so that it outlives the
	// caller; otherwise, with DieWithCaller, the kernel kills it (and it
	// gets its own process group) when the caller dies.
	Detach, DieWithCaller bool
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
	return Run(name, path, args, Options{Stdout: out, Stderr: out})
}

// Run starts path with args.
func Run(name, path string, args []string, o Options) (*Proc, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = o.Env
	cmd.Stdout, cmd.Stderr, cmd.Stdin = o.Stdout, o.Stderr, o.Stdin
	switch {
	case o.Detach:
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	case o.DieWithCaller:
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Record: Record{Name: name, ID: cmd.Process.Pid}, cmd: cmd, done: make(chan struct{})}
	p.StartTime, _ = StartTime(p.ID)
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// Attach finds a process again by its record; it is not our child, so its
// end is seen by polling.
func Attach(r Record) *Proc { return &Proc{Record: r} }

// Pid is the process id.
func (p *Proc) Pid() int { return p.ID }

// Done is closed when our child has ended and its output is copied; nil
// for an attached process.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool { return !p.Alive() }

// Alive reports whether the process still runs (and is still ours).
func (p *Proc) Alive() bool {
	if p.done != nil {
		select {
		case <-p.done:
			return false
		default:
			return true
		}
	}
	st, err := StartTime(p.ID)
	return err == nil && st == p.StartTime && !Zombie(p.ID)
}

// Stop sends SIGTERM, then SIGKILL after 10 s, and waits for the exit.
func (p *Proc) Stop() { p.StopWithin(10 * time.Second) }

// StopWithin sends SIGTERM, then SIGKILL after grace, and waits for the
// end. It is idempotent.
func (p *Proc) StopWithin(grace time.Duration) {
	if !p.Alive() {
		return
	}
	_ = syscall.Kill(p.ID, syscall.SIGTERM)
	if p.wait(grace) {
		return
	}
	_ = syscall.Kill(p.ID, syscall.SIGKILL)
	p.wait(10 * time.Second)
}

// Kill ends the process at once, as a crash would.
func (p *Proc) Kill() {
	if !p.Alive() {
		return
	}
	_ = syscall.Kill(p.ID, syscall.SIGKILL)
	p.wait(10 * time.Second)
}

func (p *Proc) wait(d time.Duration) bool {
	if p.done != nil {
		select {
		case <-p.done:
			return true
		case <-time.After(d):
			return false
		}
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !p.Alive() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return !p.Alive()
}

// StartTime is when process pid started, in clock ticks since boot (field
// 22 of /proc/<pid>/stat).
func StartTime(pid int) (uint64, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 20 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Zombie reports whether process pid has ended and waits to be reaped.
func Zombie(pid int) bool {
	f, err := statFields(pid)
	return err == nil && len(f) > 0 && f[0] == "Z"
}

// statFields are the fields of /proc/<pid>/stat after the command name,
// which may hold spaces: the state is the first.
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	return strings.Fields(s[i+1:]), nil
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
// binary's metrics or probe address. It is picked below the kernel's
// ephemeral range (from 20000): a port from that range, which ":0" gives,
// can be taken by any outgoing connection's local end before the binary
// binds it, and again whenever a harness restarts the binary on the same
// port (a restarted controller in test/suites/e2e exited with "bind: address
// already in use" on its metrics port so, under load).
func FreePort() (int, error) {
	low, high := 20000, ephemeralStart()
	if high-low < 1000 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port, nil
	}
	var last error
	for range 100 {
		p := low + rand.IntN(high-low)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			last = err
			continue
		}
		_ = l.Close()
		return p, nil
	}
	return 0, fmt.Errorf("procs: no free loopback port in %d-%d: %w", low, high-1, last)
}

// ephemeralStart is the first port of the kernel's ephemeral range (32768
// when it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}

// CPUTime is the CPU time (user and system) process pid has used.
func CPUTime(pid int) (time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	// utime and stime are the 14th and 15th fields, in clock ticks
	// (USER_HZ, 100 on Linux).
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

// CPUSeconds is CPUTime in seconds, for rates.
func CPUSeconds(pid int) (float64, error) {
	d, err := CPUTime(pid)
	return d.Seconds(), err
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

// StartLogged runs <BinDir>/<name> with its output appended to
// <dir>/<logName>.log, stops it when the test ends, and then shows the
// log (its last 256 KiB, enough for a goroutine dump and what led to it)
// if the test failed.
func StartLogged(t testing.TB, dir, name, logName string, args ...string) *Proc {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(dir, logName+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(name, logf, args...)
	if err != nil {
		logf.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 256<<10 {
				b = b[len(b)-256<<10:]
			}
			t.Logf("%s log:\n%s", logName, b)
		}
	})
	return p
}
