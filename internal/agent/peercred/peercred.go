// Package peercred says who is at the other end of a Unix socket, from the
// kernel (SO_PEERCRED, SO_PEERPIDFD), not from what the caller says: the
// agent's registration and mapper sockets bind the names handlers and
// mappers take to the process that took them.
package peercred

// Each connection to a socket served with Creds carries the peer's
// credentials (SO_PEERCRED: uid, gid and pid as this agent's pid namespace
// sees it, 0 when it does not) and, where the kernel has pidfs (Linux 6.9
// and later), the inode of the peer's pidfd (SO_PEERPIDFD), which names one
// process until the machine reboots whatever namespace it runs in.
//
// A registration binds a handler's or mapper's name to its caller (a
// process), not to a connection: KubeEdge's mapper-framework dials a new
// connection for each call.
//
// How two callers are told apart, from the strongest evidence both have:
//  1. pidfs inodes: the same process or not (restarts, containers and pid
//     namespaces included);
//  2. pids seen in this agent's pid namespace, with each process's start
//     time (a reused pid is another process);
//  3. otherwise the uid alone: mappers in other pid namespaces on a kernel
//     without pidfs (Linux 6.1, Debian 12's) are one caller per uid. Give
//     each handler and mapper its own uid (runAsUser) there, as the chart
//     does, or run the agent with hostPID.
// Several of them in one process are one caller: a process cannot be kept
// from itself.

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Caller is who is at the other end of a connection. The zero caller (no
// credentials: a call from within the agent's process, as tests make) is
// trusted.
type Caller struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// PID as this agent saw it, with its start time (clock ticks since
	// boot) and the agent's pid namespace; 0 when not seen.
	PID   int32  `json:"pid,omitempty"`
	Start uint64 `json:"start,omitempty"`
	PidNS uint64 `json:"pidNS,omitempty"`
	// PidIno is the pidfs inode of the process (0 without pidfs).
	PidIno uint64 `json:"pidIno,omitempty"`
	// Boot is the boot id: PID, Start and PidIno mean something only
	// within one boot.
	Boot string `json:"boot,omitempty"`
	// known is false for the zero caller.
	Known bool `json:"known,omitempty"`
}

func (c Caller) String() string {
	if !c.Known {
		return "the agent's own process"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "uid %d", c.UID)
	if c.PID > 0 {
		fmt.Fprintf(&b, " pid %d", c.PID)
	}
	return b.String()
}

// Same reports whether c and o are the same caller, on the strongest
// evidence both carry (see the top of this file).
func (c Caller) Same(o Caller) bool {
	if !c.Known || !o.Known {
		return c.Known == o.Known
	}
	sameBoot := c.Boot != "" && c.Boot == o.Boot
	if sameBoot && c.PidIno != 0 && o.PidIno != 0 {
		return c.PidIno == o.PidIno
	}
	if sameBoot && c.PID > 0 && o.PID > 0 && c.PidNS != 0 && c.PidNS == o.PidNS {
		return c.PID == o.PID && c.Start == o.Start
	}
	return c.UID == o.UID
}

// Distinct reports whether c can be told apart from another caller of its
// uid (pidfs or a visible pid): when not, the registration says so.
func (c Caller) Distinct() bool { return !c.Known || c.PidIno != 0 || c.PID > 0 }

// host holds what a caller's evidence is relative to: this boot and this
// agent's pid namespace.
type host struct {
	boot  string
	pidNS uint64
}

var readHost = sync.OnceValue(func() host {
	var h host
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		h.boot = strings.TrimSpace(string(b))
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err == nil {
		h.pidNS = st.Ino
	}
	return h
})

// startTime is the start time of pid (field 22 of /proc/<pid>/stat), 0
// when it cannot be read.
func startTime(pid int32) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
	if err != nil {
		return 0
	}
	// The command (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// Of reads the credentials of the peer of a Unix socket connection.
func Of(c *net.UnixConn) (Caller, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Caller{}, err
	}
	var cred *unix.Ucred
	var credErr error
	pidfd := -1
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if credErr == nil {
			// Refused by kernels before 6.5; the uid and pid then serve.
			if v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
				pidfd = v
			}
		}
	}); err != nil {
		return Caller{}, err
	}
	if credErr != nil {
		return Caller{}, fmt.Errorf("peer credentials: %w", credErr)
	}
	h := readHost()
	out := Caller{Known: true, UID: cred.Uid, GID: cred.Gid, Boot: h.boot}
	if cred.Pid > 0 {
		out.PID, out.PidNS, out.Start = cred.Pid, h.pidNS, startTime(cred.Pid)
	}
	if pidfd >= 0 {
		var fs unix.Statfs_t
		var st unix.Stat_t
		// Before pidfs (6.9) pidfds are anonymous inodes that all share
		// one inode number: useless as an identity.
		if unix.Fstatfs(pidfd, &fs) == nil && fs.Type == unix.PID_FS_MAGIC && unix.Fstat(pidfd, &st) == nil {
			out.PidIno = st.Ino
		}
		_ = unix.Close(pidfd)
	}
	return out, nil
}

// Creds are the server's transport credentials: no security on the
// wire (a local socket whose mode keeps strangers out), the kernel's word
// on who connected as the AuthInfo.
type Creds struct{}

type authInfo struct {
	credentials.CommonAuthInfo
	caller Caller
}

func (authInfo) AuthType() string { return "peercred" }

func (Creds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, nil, fmt.Errorf("peercred: %T is not a Unix socket connection: its caller is unknown", c)
	}
	who, err := Of(uc)
	if err != nil {
		return nil, nil, fmt.Errorf("peercred: %w", err)
	}
	return c, authInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, caller: who}, nil
}

func (Creds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, fmt.Errorf("peercred: peer credentials are for the server side")
}

func (Creds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (p Creds) Clone() credentials.TransportCredentials { return p }
func (Creds) OverrideServerName(string) error           { return nil }

// ListenerOf is the process serving the Unix socket at path (the peer
// credentials a client reads are the listener's).
func ListenerOf(ctx context.Context, path string) (Caller, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return Caller{}, err
	}
	defer c.Close()
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Caller{}, fmt.Errorf("dialing %s gave a %T, not a Unix socket", path, c)
	}
	return Of(uc)
}

// FromContext is the caller of an RPC; the zero caller when the call did
// not come over a connection (the agent calling itself).
func FromContext(ctx context.Context) Caller {
	if p, ok := peer.FromContext(ctx); ok {
		if ci, ok := p.AuthInfo.(authInfo); ok {
			return ci.caller
		}
	}
	return Caller{}
}
