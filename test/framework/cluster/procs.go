package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dowse-dev/dowse/test/framework/procs"
)

// proc is a process the cluster started; its Record is kept in pids.json
// so that a later command (dowse-cluster down) finds it again.
type proc = procs.Proc

// startProc runs path with args, output appended to logPath. With detach the
// process gets its own session and outlives the caller (dowse-cluster up);
// otherwise the kernel kills it if the caller dies, so a crashed test leaves
// nothing behind.
func startProc(name, path string, args, env []string, logPath string, detach bool) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	return procs.Run(name, path, args, procs.Options{Env: env, Stdout: logf, Stderr: logf, Detach: detach, DieWithCaller: !detach})
}

// procInfo is what cleanup needs of any process on the machine.
type procInfo struct {
	pid, ppid int
	exe       string
	cmdline   []string
}

func listProcs() []procInfo {
	ents, _ := os.ReadDir("/proc")
	var out []procInfo
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, procInfo{pid: pid, ppid: ppid, exe: exe, cmdline: strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")})
	}
	return out
}

// shimsOf finds the runc shims of the containerd whose socket is address: the
// shims daemonize, so they are not our children and only their command line
// (-address <socket>) ties them to this cluster.
func shimsOf(address string) []procInfo {
	var out []procInfo
	for _, p := range listProcs() {
		if !strings.HasSuffix(p.exe, "containerd-shim-runc-v2") {
			continue
		}
		for i, a := range p.cmdline {
			if a == "-address" && i+1 < len(p.cmdline) && p.cmdline[i+1] == address {
				out = append(out, p)
			}
		}
	}
	return out
}

// descendants lists every process under root, deepest first.
func descendants(all []procInfo, root int) []int {
	children := map[int][]int{}
	for _, p := range all {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	var out []int
	var walk func(int)
	walk = func(pid int) {
		for _, c := range children[pid] {
			walk(c)
			out = append(out, c)
		}
	}
	walk(root)
	return out
}

// killShims kills the containers under each shim of address, then the shims.
// Containers are the shims' children; a shim killed first would leave them
// orphaned and running.
func killShims(address string) []int {
	var killed []int
	for _, s := range shimsOf(address) {
		all := listProcs()
		for _, pid := range descendants(all, s.pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killed = append(killed, pid)
		}
		_ = syscall.Kill(s.pid, syscall.SIGKILL)
		killed = append(killed, s.pid)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range killed {
		for time.Now().Before(deadline) {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil || procs.Zombie(pid) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		// Reap it if it became ours (see becomeSubreaper); ECHILD otherwise.
		_, _ = syscall.Wait4(pid, nil, syscall.WNOHANG, nil)
	}
	return killed
}

// reapShims reaps shims that exited on their own (a deleted pod's) and were
// adopted by this process. Only zombies named containerd-shim are waited
// for: another child's exit status belongs to whoever started it.
func reapShims() {
	me := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 2 || f[0] != "Z" || f[1] != strconv.Itoa(me) || s[open+1:end] != "containerd-shim" {
			continue
		}
		_, _ = syscall.Wait4(pid, nil, syscall.WNOHANG, nil)
	}
}

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER of prctl(2); package syscall
// does not name it.
const prSetChildSubreaper = 36

// becomeSubreaper makes orphaned descendants (the shims, which daemonize, and
// their containers) children of this process rather than of PID 1, so that
// killShims can reap them. On machines whose PID 1 does not reap (a container
// running a plain program as PID 1, like ours), they would otherwise stay as
// zombies after every test run.
func becomeSubreaper() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return errno
	}
	return nil
}

// MountsUnder lists the mount points at or below dir, deepest first.
func MountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	var out []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, s.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll detaches every mount under dir; a mount can appear more than
// once (stacked), so it repeats until none is left.
func unmountAll(dir string) error {
	for range 5 {
		mps, err := MountsUnder(dir)
		if err != nil || len(mps) == 0 {
			return err
		}
		for _, mp := range mps {
			_ = syscall.Unmount(mp, syscall.MNT_DETACH)
		}
	}
	mps, _ := MountsUnder(dir)
	if len(mps) > 0 {
		return fmt.Errorf("still mounted: %v", mps)
	}
	return nil
}

func writePids(path string, ps []*proc) error {
	recs := make([]procs.Record, len(ps))
	for i, p := range ps {
		recs[i] = p.Record
	}
	b, err := json.MarshalIndent(recs, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func readPids(path string) ([]*proc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var recs []procs.Record
	if err := json.Unmarshal(b, &recs); err != nil {
		return nil, err
	}
	out := make([]*proc, len(recs))
	for i, r := range recs {
		out[i] = procs.Attach(r)
	}
	return out, nil
}
