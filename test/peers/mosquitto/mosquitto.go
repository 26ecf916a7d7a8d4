// Package mosquitto runs Debian's MQTT broker for tests, on a loopback
// port of its own, and subscribes with its own client (mosquitto_sub), so
// that what a mapper publishes is checked by code Dowse did not write.
package mosquitto

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/procs"
)

// Broker is a running mosquitto.
type Broker struct {
	t    testing.TB
	dir  string
	Port int
	// WSPort is its MQTT over WebSocket listener's.
	WSPort int
	proc   *procs.Proc
}

func binary(t testing.TB, name string) string {
	t.Helper()
	for _, p := range []string{"/usr/sbin/" + name, "/usr/bin/" + name} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	msg := fmt.Sprintf("%s not found: install Debian's mosquitto and mosquitto-clients (hack/install-deps.sh)", name)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// Start runs a broker with persistence on (so that a restart keeps QoS 1
// sessions, as a production broker does) and stops it when the test ends.
func Start(t testing.TB) *Broker { return StartWithUsers(t, nil) }

// StartWithUsers is Start with logins required: users maps user names to
// passwords (hashed by mosquitto_passwd into the broker's password file);
// nil allows anonymous clients.
func StartWithUsers(t testing.TB, users map[string]string) *Broker {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	l, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wsPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	b := &Broker{t: t, dir: t.TempDir(), Port: port, WSPort: wsPort}
	auth := "allow_anonymous true\n"
	if users != nil {
		pw := filepath.Join(b.dir, "passwd")
		if err := os.WriteFile(pw, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		for u, p := range users {
			if out, err := exec.Command(binary(t, "mosquitto_passwd"), "-b", pw, u, p).CombinedOutput(); err != nil {
				t.Fatalf("mosquitto_passwd: %v\n%s", err, out)
			}
		}
		auth = "allow_anonymous false\npassword_file " + pw + "\n"
	}
	if os.Geteuid() == 0 {
		// As root, mosquitto would switch to user mosquitto, who can read
		// neither the test's password file nor write its persistence.
		auth += "user root\n"
	}
	// The authentication applies to both listeners, MQTT's and
	// WebSocket's (per_listener_settings is false by default).
	conf := fmt.Sprintf("listener %d 127.0.0.1\nlistener %d 127.0.0.1\nprotocol websockets\n%spersistence true\npersistence_location %s/\nautosave_interval 1\n", port, wsPort, auth, b.dir)
	if err := os.WriteFile(filepath.Join(b.dir, "mosquitto.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	b.start()
	t.Cleanup(b.Stop)
	return b
}

// Addr is the broker's URL for a pushMethod.
func (b *Broker) Addr() string { return fmt.Sprintf("tcp://127.0.0.1:%d", b.Port) }

// WSAddr is the broker's MQTT over WebSocket URL for a pushMethod.
func (b *Broker) WSAddr() string { return fmt.Sprintf("ws://127.0.0.1:%d/mqtt", b.WSPort) }

func (b *Broker) start() {
	b.t.Helper()
	log, err := os.OpenFile(filepath.Join(b.dir, "mosquitto.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		b.t.Fatal(err)
	}
	defer log.Close() // the broker has its own descriptor
	b.proc, err = procs.Run("mosquitto", binary(b.t, "mosquitto"), []string{"-c", filepath.Join(b.dir, "mosquitto.conf")},
		procs.Options{Stdout: log, Stderr: log, DieWithCaller: true})
	if err != nil {
		b.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", b.Port))
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(b.dir, "mosquitto.log"))
			b.t.Fatalf("mosquitto did not listen: %v\n%s", err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the broker (by its pid) and waits for it.
func (b *Broker) Stop() {
	if b.proc != nil {
		b.proc.StopWithin(5 * time.Second)
	}
	b.proc = nil
}

// StartAgain starts a stopped broker again on the same port, with what it
// persisted.
func (b *Broker) StartAgain() {
	b.t.Helper()
	b.start()
}

// Restart stops the broker and starts it again on the same port.
func (b *Broker) Restart() {
	b.t.Helper()
	b.Stop()
	b.start()
}

// Sub is a running mosquitto_sub.
type Sub struct {
	mu    sync.Mutex
	lines []string
	proc  *procs.Proc
}

// Subscribe runs mosquitto_sub on topic (wildcards allowed) at qos with a
// persistent session (client id id; empty: a clean one), printing
// "topic payload" lines, until the test ends.
func (b *Broker) Subscribe(t testing.TB, topic string, qos int, id string) *Sub {
	t.Helper()
	return b.SubscribeAs(t, topic, qos, id, "", "")
}

// SubscribeAs is Subscribe signed in as user with password.
func (b *Broker) SubscribeAs(t testing.TB, topic string, qos int, id, user, password string) *Sub {
	t.Helper()
	// -d prints the protocol's steps: Subscribe returns once the broker
	// acknowledged the subscription, so nothing published after is missed.
	args := []string{"-h", "127.0.0.1", "-p", fmt.Sprint(b.Port), "-t", topic, "-q", fmt.Sprint(qos), "-v", "-d"}
	if user != "" {
		args = append(args, "-u", user, "-P", password)
	}
	if id != "" {
		args = append(args, "-i", id, "-c")
	}
	// stdbuf (coreutils): line-buffered, else the steps wait in stdio's
	// buffer for a pipe.
	path := binary(t, "mosquitto_sub")
	if sb, err := exec.LookPath("stdbuf"); err == nil {
		path, args = sb, append([]string{"-oL", path}, args...)
	}
	s := &Sub{}
	subscribed := make(chan struct{})
	out := procs.NewLines()
	out.Each = func(l string) {
		if strings.HasPrefix(l, "Client ") || strings.HasPrefix(l, "Subscribed (mid") {
			if strings.HasPrefix(l, "Subscribed (mid") {
				select {
				case <-subscribed:
				default:
					close(subscribed)
				}
			}
			return
		}
		s.mu.Lock()
		s.lines = append(s.lines, l)
		s.mu.Unlock()
	}
	var err error
	if s.proc, err = procs.Run("mosquitto_sub", path, args, procs.Options{Stdout: out, Stderr: out, DieWithCaller: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	select {
	case <-subscribed:
	case <-s.proc.Done():
		t.Fatalf("mosquitto_sub exited: %q", s.Lines())
	case <-time.After(10 * time.Second):
		t.Fatalf("mosquitto_sub did not subscribe within 10s: %q", s.Lines())
	}
	return s
}

// Lines are what mosquitto_sub printed so far.
func (s *Sub) Lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// Count is how many lines contain every one of sub.
func (s *Sub) Count(sub ...string) int {
	n := 0
next:
	for _, l := range s.Lines() {
		for _, x := range sub {
			if !strings.Contains(l, x) {
				continue next
			}
		}
		n++
	}
	return n
}

// Stop stops mosquitto_sub.
func (s *Sub) Stop() { s.proc.Kill() }

// Publish publishes payload on topic with mosquitto_pub at QoS 1, retained
// when retain is set; an empty payload is sent as a zero-length message
// (which clears a retained one).
func (b *Broker) Publish(t testing.TB, topic string, payload []byte, retain bool) {
	t.Helper()
	b.PublishAs(t, "", "", topic, payload, retain)
}

// PublishAs is Publish signed in as user with password.
func (b *Broker) PublishAs(t testing.TB, user, password, topic string, payload []byte, retain bool) {
	t.Helper()
	args := []string{"-h", "127.0.0.1", "-p", fmt.Sprint(b.Port), "-t", topic, "-q", "1"}
	if user != "" {
		args = append(args, "-u", user, "-P", password)
	}
	if retain {
		args = append(args, "-r")
	}
	if len(payload) == 0 {
		args = append(args, "-n")
	} else {
		args = append(args, "-s") // the payload from stdin, as it is
	}
	cmd := exec.Command(binary(t, "mosquitto_pub"), args...)
	cmd.Stdin = bytes.NewReader(payload)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_pub %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
