// Package snmpd runs Debian's SNMP agent (net-snmp's snmpd) for tests: a
// plain foreground process on a loopback address and UDP port of its own,
// or on an address of a network namespace the test makes (Network), with its configuration and persistent state in the test's temporary
// folder, stopped by its pid when the test ends. Its command-line tools
// (snmpget, snmpset) check what Dowse reads and writes with code Dowse did
// not write.
package snmpd

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// User is an SNMPv3 USM user (authPriv when PrivPass is set, authNoPriv
// when only AuthPass is).
type User struct {
	Name                string
	AuthProto, AuthPass string // e.g. SHA, and at least 8 characters
	PrivProto, PrivPass string // e.g. AES
	// ReadWrite lets the user SET.
	ReadWrite bool
}

// Config is what an agent serves. Fields left empty are not written to its
// configuration, so that snmpd's defaults apply: sysName (the machine's
// host name), sysContact and sysLocation are then SET-able.
type Config struct {
	// Network, when set, is where the agent runs: on an address of its
	// namespace (Host, or a new one), on port 161 unless Port says
	// otherwise, answering the test's side of the link.
	Network *Network
	// Host is the address to listen on (default 127.0.0.1, or a new
	// address of Network).
	Host string
	// Port is the UDP port; 0 picks a free one (161 in a Network).
	Port int
	// ROCommunity and RWCommunity are the v1/v2c communities (default
	// "public" read-only; no read-write one).
	ROCommunity, RWCommunity string
	Users                    []User
	// SysDescr, SysObjectID and SysName, when set, are fixed (and then
	// read-only).
	SysDescr, SysObjectID, SysName string
	// SysContact and SysLocation, when set, are fixed too.
	SysContact, SysLocation string
	// SysServices, when set, is sysServices (net-snmp has none by
	// default).
	SysServices int
}

// Agent is a running snmpd.
type Agent struct {
	Config
	dir  string
	proc *procs.Proc
	out  *procs.Lines
	t    testing.TB
}

// Binary returns snmpd's path, failing under CI=true and skipping
// otherwise when Debian's snmpd is not installed.
func Binary(t testing.TB) string { return find(t, "snmpd") }

func find(t testing.TB, name string) string {
	t.Helper()
	for _, p := range []string{"/usr/sbin/" + name, "/usr/bin/" + name} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	npmpeer.Unavailable(t, "%s not found: run hack/install-deps.sh (Debian snmpd and snmp)", name)
	return ""
}

// FreePort returns a UDP port free on every host, from 20000-32767 (below
// the kernel's ephemeral range, where the tests' own sockets land).
func FreePort(t testing.TB, hosts ...string) int {
	t.Helper()
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1"}
	}
	for range 100 {
		port := 20000 + rand.IntN(12768)
		free := true
		for _, h := range hosts {
			c, err := net.ListenPacket("udp", net.JoinHostPort(h, strconv.Itoa(port)))
			if err != nil {
				free = false
				break
			}
			c.Close()
		}
		if free {
			return port
		}
	}
	t.Fatalf("no UDP port free on all of %v", hosts)
	return 0
}

// Start runs an agent with cfg and stops it when the test ends.
func Start(t testing.TB, cfg Config) *Agent {
	t.Helper()
	bin := Binary(t)
	clients := "127.0.0.0/8"
	switch {
	case cfg.Network != nil:
		if cfg.Host == "" {
			cfg.Host = cfg.Network.NewAddr(t)
		}
		if cfg.Port == 0 {
			cfg.Port = 161
		}
		clients = cfg.Network.Prefix.String()
	case cfg.Host == "":
		cfg.Host = "127.0.0.1"
	}
	if cfg.Port == 0 {
		cfg.Port = FreePort(t, cfg.Host)
	}
	if cfg.ROCommunity == "" {
		cfg.ROCommunity = "public"
	}
	a := &Agent{Config: cfg, dir: t.TempDir(), t: t}
	var c strings.Builder
	fmt.Fprintf(&c, "agentAddress udp:%s:%d\n", cfg.Host, cfg.Port)
	// The source a community is good from: where the tests' requests come
	// from (on loopback 127.0.0.1 whatever address the agent has).
	fmt.Fprintf(&c, "rocommunity %s %s\n", cfg.ROCommunity, clients)
	if cfg.RWCommunity != "" {
		fmt.Fprintf(&c, "rwcommunity %s %s\n", cfg.RWCommunity, clients)
	}
	for _, u := range cfg.Users {
		level := "auth"
		line := fmt.Sprintf("createUser %s %s %q", u.Name, u.AuthProto, u.AuthPass)
		if u.PrivPass != "" {
			level = "priv"
			line += fmt.Sprintf(" %s %q", u.PrivProto, u.PrivPass)
		}
		c.WriteString(line + "\n")
		access := "rouser"
		if u.ReadWrite {
			access = "rwuser"
		}
		fmt.Fprintf(&c, "%s %s %s\n", access, u.Name, level)
	}
	for _, kv := range [][2]string{{"sysDescr", cfg.SysDescr}, {"sysObjectID", cfg.SysObjectID}, {"sysName", cfg.SysName},
		{"sysContact", cfg.SysContact}, {"sysLocation", cfg.SysLocation}} {
		if kv[1] != "" {
			fmt.Fprintf(&c, "%s %s\n", kv[0], kv[1])
		}
	}
	if cfg.SysServices != 0 {
		fmt.Fprintf(&c, "sysServices %d\n", cfg.SysServices)
	}
	if err := os.WriteFile(filepath.Join(a.dir, "snmpd.conf"), []byte(c.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	a.start(bin)
	t.Cleanup(a.Stop)
	return a
}

// Addr is the agent's host:port.
func (a *Agent) Addr() string { return net.JoinHostPort(a.Host, strconv.Itoa(a.Port)) }

// env keeps snmpd and its tools away from MIB files (Debian ships only a
// few, so loading them prints pages of warnings) and from /var/lib/snmp.
func (a *Agent) env() []string {
	return append(os.Environ(), "MIBS=", "SNMP_PERSISTENT_DIR="+filepath.Join(a.dir, "persist"), "SNMPCONFPATH="+a.dir)
}

func (a *Agent) start(bin string) {
	a.t.Helper()
	a.out = procs.NewLines()
	// -f: no fork; -C: only our configuration; -Lo: log to stdout, where
	// it prints its version once it listens.
	args := []string{"-f", "-C", "-c", filepath.Join(a.dir, "snmpd.conf"), "-Lo", "-p", filepath.Join(a.dir, "snmpd.pid")}
	name := bin
	if a.Network != nil {
		// ip netns exec execs snmpd itself: the pid stopped is snmpd's.
		name, args = "ip", append([]string{"netns", "exec", a.Network.NS, bin}, args...)
	}
	p, err := procs.Run("snmpd", name, args, procs.Options{Env: a.env(), Stdout: a.out, Stderr: a.out, DieWithCaller: true})
	if err != nil {
		a.t.Fatal(err)
	}
	a.proc = p
	a.out.EndWith(p)
	if _, _, err := a.out.Wait("NET-SNMP version", 0, 10*time.Second); err != nil {
		a.Stop()
		a.t.Fatalf("snmpd on %s did not start: %v\n%s", a.Addr(), err, a.out)
	}
}

// Stop stops the agent (by its pid) and waits for it.
func (a *Agent) Stop() {
	if a.proc != nil {
		a.proc.StopWithin(5 * time.Second)
	}
	a.proc = nil
}

// Restart starts a stopped agent again on the same address.
func (a *Agent) Restart(t testing.TB) {
	t.Helper()
	a.Stop()
	a.start(Binary(t))
}

// Get reads oid with Debian's snmpget (v2c, community) and returns the
// value as snmpget prints it after "TYPE: " (strings without quotes).
func (a *Agent) Get(t testing.TB, community, oid string) string {
	t.Helper()
	out := a.tool(t, "snmpget", "-v2c", "-c", community, "-Oqv", a.Addr(), oid)
	return strings.Trim(strings.TrimSpace(out), `"`)
}

// Set writes oid with Debian's snmpset (v2c, community); typ is snmpset's
// type letter (s: string, i: integer, ...).
func (a *Agent) Set(t testing.TB, community, oid, typ, value string) {
	t.Helper()
	a.tool(t, "snmpset", "-v2c", "-c", community, a.Addr(), oid, typ, value)
}

func (a *Agent) tool(t testing.TB, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(find(t, name), append([]string{"-t", "2", "-r", "1"}, args...)...)
	cmd.Env = a.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}
