// Package dbpeer runs Debian's Redis and MariaDB servers for tests, each
// on a loopback port and a scratch directory of its own, and reads back
// with their own clients (redis-cli, mariadb), so that what a mapper
// writes is checked by code Dowse did not write.
package dbpeer

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/procs"
)

func binary(t testing.TB, pkg string, names ...string) string {
	t.Helper()
	for _, name := range names {
		for _, p := range []string{"/usr/sbin/" + name, "/usr/bin/" + name} {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := fmt.Sprintf("%s not found: install Debian's %s (hack/install-deps.sh)", names[0], pkg)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// server is a peer process started and stopped by pid (test/framework/procs).
type server struct {
	t    testing.TB
	name string
	log  string
	args []string
	bin  string
	proc *procs.Proc
	port int
	// ready says the server answers.
	ready func() error
}

func (s *server) start() {
	s.t.Helper()
	log, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer log.Close()
	s.proc, err = procs.Run(s.name, s.bin, s.args, procs.Options{Stdout: log, Stderr: log, DieWithCaller: true})
	if err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := s.ready()
		if err == nil {
			return
		}
		if s.proc.Exited() {
			out, _ := os.ReadFile(s.log)
			s.t.Fatalf("%s exited: %v\n%s", s.name, err, out)
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(s.log)
			s.t.Fatalf("%s not ready: %v\n%s", s.name, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the server (SIGTERM by its pid, SIGKILL after 30 s) and
// waits for it.
func (s *server) Stop() {
	if s.proc != nil {
		s.proc.StopWithin(30 * time.Second)
		s.proc = nil
	}
}

// Start starts a stopped server again, on its port and data.
func (s *server) Start() {
	s.t.Helper()
	if s.proc == nil {
		s.start()
	}
}

// Redis is a running redis-server.
type Redis struct {
	server
	password string
	cli      string
}

// StartRedis runs redis-server with its data appended to a file synced at
// every write (so that a restart keeps what it acknowledged) and, when
// password is set, requiring it; it stops when the test ends.
func StartRedis(t testing.TB, password string) *Redis {
	t.Helper()
	dir := t.TempDir()
	r := &Redis{password: password, cli: binary(t, "redis-tools", "redis-cli")}
	r.server = server{t: t, name: "redis-server", log: filepath.Join(dir, "redis.log"), bin: binary(t, "redis-server", "redis-server"), port: freePort(t)}
	r.args = []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(r.port), "--dir", dir, "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "no", "--daemonize", "no"}
	if password != "" {
		r.args = append(r.args, "--requirepass", password)
	}
	r.ready = func() error {
		out, err := r.CLI(0, "PING")
		if err != nil || strings.TrimSpace(out) != "PONG" {
			return fmt.Errorf("PING: %q %w", out, err)
		}
		return nil
	}
	r.start()
	t.Cleanup(r.Stop)
	return r
}

// Addr is host:port for a dbMethod.
func (r *Redis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// CLI runs redis-cli on database db with args and returns its output.
func (r *Redis) CLI(db int, args ...string) (string, error) {
	a := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(r.port), "-n", strconv.Itoa(db)}
	if r.password != "" {
		a = append(a, "-a", r.password, "--no-auth-warning")
	}
	out, err := exec.Command(r.cli, append(a, args...)...).CombinedOutput()
	return string(out), err
}

// MariaDB is a running mariadbd.
type MariaDB struct {
	server
	dir, client string
}

// StartMariaDB makes a data directory and runs mariadbd on it, with
// database db and a user that may use it, signing in with password; it
// stops when the test ends.
func StartMariaDB(t testing.TB, db, user, password string) *MariaDB {
	t.Helper()
	dir := t.TempDir()
	m := &MariaDB{dir: dir, client: binary(t, "mariadb-client", "mariadb")}
	install := binary(t, "mariadb-server", "mariadb-install-db")
	m.server = server{t: t, name: "mariadbd", log: filepath.Join(dir, "mariadbd.log"), bin: binary(t, "mariadb-server", "mariadbd"), port: freePort(t)}
	data := filepath.Join(dir, "data")
	args := []string{"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	if out, err := exec.Command(install, args...).CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	m.args = []string{"--no-defaults", "--datadir=" + data, "--socket=" + m.socket(), "--port=" + strconv.Itoa(m.port),
		"--bind-address=127.0.0.1", "--skip-name-resolve", "--pid-file=" + filepath.Join(dir, "mariadbd.pid"),
		"--innodb-buffer-pool-size=16M", "--log-error=" + m.log}
	if os.Geteuid() == 0 {
		m.args = append(m.args, "--user=root")
	}
	m.ready = func() error { _, err := m.SQL("SELECT 1"); return err }
	m.start()
	t.Cleanup(m.Stop)
	q := fmt.Sprintf("CREATE DATABASE `%s`; CREATE USER '%s'@'%%' IDENTIFIED BY '%s'; GRANT ALL ON `%s`.* TO '%s'@'%%';", db, user, password, db, user)
	if out, err := m.SQL(q); err != nil {
		t.Fatalf("%s: %v\n%s", q, err, out)
	}
	return m
}

func (m *MariaDB) socket() string { return filepath.Join(m.dir, "mariadbd.sock") }

// Addr is host:port for a dbMethod.
func (m *MariaDB) Addr() string { return "127.0.0.1:" + strconv.Itoa(m.port) }

// SQL runs statements with the mariadb client as root over the server's
// socket and returns the rows, tab-separated, one a line.
func (m *MariaDB) SQL(statements string) (string, error) {
	out, err := exec.Command(m.client, "--no-defaults", "-S", m.socket(), "-u", "root", "-N", "-B", "-e", statements).CombinedOutput()
	return string(out), err
}
