package mapper_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/peers/mosquitto"
)

// logLines counts the mapper's log lines holding a string, besides
// logging them to the test.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger(t *testing.T) logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, prefix+" "+args)
		l.mu.Unlock()
		t.Log(prefix, args)
	}, funcr.Options{Verbosity: 1})
}

func (l *logLines) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}

type sinkRun struct {
	agent   *mappertest.Agent
	fake    *fakeDevices
	metrics *mapper.Metrics
	logs    *logLines
}

func startSinks(t *testing.T, dev *dmiv1beta1.Device, cfg func(*mapper.Config)) *sinkRun {
	t.Helper()
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, []*dmiv1beta1.Device{dev})
	r := &sinkRun{agent: agent, fake: newFake(), metrics: mapper.NewMetrics(), logs: &logLines{}}
	r.fake.set("A", "t", 1.0)
	c := mapper.Config{Protocol: "fake", StateDir: dir, NewDriver: r.fake.newDriver, Logger: r.logs.logger(t), Metrics: r.metrics,
		DefaultCollectCycle: 20 * time.Millisecond, ReconnectInitial: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond,
		ReregisterInterval: time.Hour, CallTimeout: 2 * time.Second}
	cfg(&c)
	mappertest.RunMapper(t, c)
	return r
}

// set changes the fake device's reading and waits until the twin reported
// it: the mapper read it, whatever its sinks do.
func (r *sinkRun) set(t *testing.T, v float64) {
	t.Helper()
	r.fake.set("A", "t", v)
	r.agent.WaitReported(t, "ns/a", "temp", strconv.FormatFloat(v, 'g', -1, 64), 0, wait)
}

func waitUntil(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// receiver is a real HTTP server taking readings.
type receiver struct {
	mu       sync.Mutex
	status   int // the answer; 200 unless set
	values   []string
	bodies   []map[string]any
	attempts int
	auth     string
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.attempts++
	if u, p, ok := req.BasicAuth(); ok {
		rc.auth = u + ":" + p
	}
	if rc.status != 0 && rc.status != http.StatusOK {
		w.WriteHeader(rc.status)
		return
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || req.URL.Path != "/readings" || req.Header.Get("Content-Type") != "application/json" {
		w.WriteHeader(http.StatusTeapot)
		rc.values = append(rc.values, fmt.Sprintf("bad request %s %s %q: %v", req.URL.Path, req.Header.Get("Content-Type"), b, err))
		return
	}
	rc.bodies = append(rc.bodies, m)
	rc.values = append(rc.values, fmt.Sprint(m["value"]))
}

func (rc *receiver) set(status int) {
	rc.mu.Lock()
	rc.status = status
	rc.mu.Unlock()
}

func (rc *receiver) got() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.values...)
}

func (rc *receiver) waitValues(t *testing.T, want ...string) {
	t.Helper()
	waitUntil(t, "the receiver's readings", func() error {
		got := rc.got()
		if strings.Join(got, " ") != strings.Join(want, " ") {
			return fmt.Errorf("got %q, want %q", got, want)
		}
		return nil
	})
}

// TestHTTPSink: a property's pushMethod.http posts each changed reading
// to a real net/http server, with the Secret's credentials (mounted in
// the sink secrets directory) as basic auth; while it answers 5xx the
// readings wait in a buffer bounded in count (the oldest dropped and
// counted) and the twin reports on; 4xx refusals are counted, dropped and
// logged once, not per reading.
func TestHTTPSink(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	port, _ := strconv.Atoi(srv.URL[strings.LastIndex(srv.URL, ":")+1:])
	secrets := t.TempDir()
	if err := os.MkdirAll(filepath.Join(secrets, "plant-sink"), 0o700); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"username": "dowse", "password": "s3cret\n"} {
		if err := os.WriteFile(filepath.Join(secrets, "plant-sink", k), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pm := &dmiv1beta1.PushMethod{DowseSecretName: "plant-sink",
		Http: &dmiv1beta1.PushMethodHTTP{Hostname: "http://127.0.0.1", Port: int64(port), Requestpath: "/readings", Timeout: 1000}}
	dev := thermo(t, "a", "A", mappertest.Prop{Name: "temp", Visitor: map[string]any{"register": "t"}, PushMethod: pm})
	var running []bool
	var runningMu sync.Mutex
	r := startSinks(t, dev, func(c *mapper.Config) {
		c.SinkSecretsDir = secrets
		c.SinkBufferMessages = 3
		c.OnSinks = func(b bool) { runningMu.Lock(); running = append(running, b); runningMu.Unlock() }
	})
	labels := `kind="http",address="` + srv.URL + `/readings"`

	r.agent.WaitReported(t, "ns/a", "temp", "1", 0, wait)
	rc.waitValues(t, "1")
	rc.mu.Lock()
	body, auth := rc.bodies[0], rc.auth
	rc.mu.Unlock()
	if body["namespace"] != "ns" || body["device"] != "a" || body["property"] != "temp" || body["type"] != "DOUBLE" || body["timestamp"] == nil {
		t.Errorf("reading posted = %v", body)
	}
	if auth != "dowse:s3cret" {
		t.Errorf("basic auth = %q, want the mounted Secret's dowse:s3cret", auth)
	}
	// Unchanged readings are not posted again (the heartbeat is a minute).
	time.Sleep(100 * time.Millisecond)
	rc.waitValues(t, "1")

	// Down (5xx): the twin goes on; the buffer keeps the newest 3.
	rc.set(http.StatusServiceUnavailable)
	for v := 2.0; v <= 7; v++ {
		r.set(t, v)
	}
	rc.set(http.StatusOK)
	rc.waitValues(t, "1", "5", "6", "7")
	if n := r.metrics.Value("dowse_mapper_sink_dropped_total", labels); n != 3 {
		t.Errorf("dropped = %v, want 3 (2, 3 and 4, the oldest beyond a buffer of 3)", n)
	}
	if n := r.metrics.Value("dowse_mapper_sink_errors_total", labels); n == 0 {
		t.Errorf("no delivery error counted while the receiver answered 503")
	}

	// Refused (4xx): counted, dropped, logged once.
	before := r.logs.count("the sink refuses readings")
	rc.set(http.StatusForbidden)
	for v := 8.0; v <= 10; v++ {
		r.set(t, v)
	}
	waitUntil(t, "refusals counted", func() error {
		if n := r.metrics.Value("dowse_mapper_sink_refused_total", labels); n != 3 {
			return fmt.Errorf("refused = %v, want 3", n)
		}
		return nil
	})
	if n := r.logs.count("the sink refuses readings") - before; n != 1 {
		t.Errorf("refusals logged %d times, want once a minute", n)
	}
	rc.set(http.StatusOK)
	r.set(t, 11)
	rc.waitValues(t, "1", "5", "6", "7", "11")
	waitUntil(t, "deliveries counted", func() error {
		if n := r.metrics.Value("dowse_mapper_sink_sent_total", labels); n != 5 {
			return fmt.Errorf("sent = %v, want 5", n)
		}
		return nil
	})

	// The Device goes, and its sink with it: so does the sink's gauge.
	gauge := "dowse_mapper_sink_buffered{" + labels + "}"
	if !strings.Contains(exposition(t, r.metrics), gauge) {
		t.Fatalf("/metrics lacks %s while the sink runs", gauge)
	}
	if _, err := r.agent.Mapper(t).RemoveDevice(context.Background(), &dmiv1beta1.RemoveDeviceRequest{DeviceNamespace: "ns", DeviceName: "a"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the stopped sink's gauge removed", func() error {
		if strings.Contains(exposition(t, r.metrics), gauge) {
			return fmt.Errorf("/metrics still has %s", gauge)
		}
		return nil
	})
	runningMu.Lock()
	defer runningMu.Unlock()
	if fmt.Sprint(running) != "[true false]" {
		t.Errorf("OnSinks calls = %v, want [true false] (the sink started, then the last one stopped)", running)
	}
}

func exposition(t *testing.T, m *mapper.Metrics) string {
	t.Helper()
	var b strings.Builder
	if _, err := m.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestMQTTSinkCredentials: a pushMethod's MQTT sink signs in with the
// Secret mounted for it; a broker that refuses the login (wrong password)
// is counted and logged once, the twin goes on, and the fixed Secret
// (read again at each connect) delivers what the buffer held, to a
// mosquitto_sub signed in as another user.
func TestMQTTSinkCredentials(t *testing.T) {
	broker := mosquitto.StartWithUsers(t, map[string]string{"mapper": "right", "reader": "r"})
	sub := broker.SubscribeAs(t, "plant/#", 1, "", "reader", "r")
	secrets := t.TempDir()
	dir := filepath.Join(secrets, "mqtt-creds")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(pw string) {
		for k, v := range map[string]string{"username": "mapper", "password": pw} {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("wrong")
	pm := &dmiv1beta1.PushMethod{DowseSecretName: "mqtt-creds",
		Mqtt: &dmiv1beta1.PushMethodMQTT{Address: broker.Addr(), Topic: "plant/a/temp", Qos: 1}}
	dev := thermo(t, "a", "A", mappertest.Prop{Name: "temp", Visitor: map[string]any{"register": "t"}, PushMethod: pm})
	r := startSinks(t, dev, func(c *mapper.Config) { c.SinkSecretsDir = secrets })
	labels := `kind="mqtt",address="` + broker.Addr() + `"`

	r.agent.WaitReported(t, "ns/a", "temp", "1", 0, wait)
	waitUntil(t, "refused logins counted", func() error {
		if n := r.metrics.Value("dowse_mapper_sink_refused_total", labels); n < 3 {
			return fmt.Errorf("refused = %v, want several", n)
		}
		return nil
	})
	if n := r.logs.count("the sink refuses readings"); n != 1 {
		t.Errorf("refused logins logged %d times, want once a minute", n)
	}
	r.set(t, 2) // the twin goes on
	write("right")
	waitUntil(t, "mosquitto_sub gets the readings", func() error {
		if sub.Count(`plant/a/temp {"namespace":"ns","device":"a","property":"temp","value":"1"`) != 1 ||
			sub.Count(`plant/a/temp {"namespace":"ns","device":"a","property":"temp","value":"2"`) != 1 {
			return fmt.Errorf("mosquitto_sub printed %q", sub.Lines())
		}
		return nil
	})
}

// TestMQTTSinkQoS: the MQTT sink publishes at each QoS (0; 2 with its
// PUBREC, PUBREL and PUBCOMP), with the retained flag and over WebSocket,
// as mosquitto and mosquitto_sub see it; a topic with a wildcard is
// refused by name and the device's other properties go on.
func TestMQTTSinkQoS(t *testing.T) {
	broker := mosquitto.Start(t)
	sub := broker.Subscribe(t, "plant/#", 2, "")
	mq := func(topic string, qos int32, retained bool) *dmiv1beta1.PushMethod {
		return &dmiv1beta1.PushMethod{Mqtt: &dmiv1beta1.PushMethodMQTT{Address: broker.Addr(), Topic: topic, Qos: qos, Retained: retained}}
	}
	dev := thermo(t, "a", "A",
		mappertest.Prop{Name: "temp", Visitor: map[string]any{"register": "t"}, PushMethod: mq("plant/a/temp", 0, false)},
		mappertest.Prop{Name: "pushed", Visitor: map[string]any{"register": "s"}, PushMethod: mq("plant/a/pushed", 2, true)},
		mappertest.Prop{Name: "label", Visitor: map[string]any{"register": "l"}, PushMethod: mq("plant/+/label", 1, false)},
		mappertest.Prop{Name: "setpoint", Visitor: map[string]any{"register": "p"}, PushMethod: &dmiv1beta1.PushMethod{
			Mqtt: &dmiv1beta1.PushMethodMQTT{Address: broker.WSAddr(), Topic: "plant/a/setpoint", Qos: 1}}})
	r := startSinks(t, dev, func(c *mapper.Config) {})
	r.fake.set("A", "s", 5.0)
	r.fake.set("A", "l", "x")
	r.fake.set("A", "p", int64(12))
	labels := `kind="mqtt",address="` + broker.Addr() + `"`
	r.agent.WaitReported(t, "ns/a", "label", "x", 0, wait)
	r.set(t, 2)
	r.fake.set("A", "s", 6.0)
	r.agent.WaitReported(t, "ns/a", "pushed", "6", 0, wait)
	want := func(s *mosquitto.Sub, topic, value string) error {
		if n := s.Count(topic+` {"namespace":"ns","device":"a","property":`, `"value":"`+value+`"`); n != 1 {
			return fmt.Errorf("%s %s printed %d times: %q", topic, value, n, s.Lines())
		}
		return nil
	}
	waitUntil(t, "mosquitto_sub gets every QoS", func() error {
		return errors.Join(want(sub, "plant/a/temp", "1"), want(sub, "plant/a/temp", "2"),
			want(sub, "plant/a/pushed", "5"), want(sub, "plant/a/pushed", "6"), want(sub, "plant/a/setpoint", "12"))
	})
	if n := r.metrics.Value("dowse_mapper_sink_sent_total", `kind="mqtt",address="`+broker.WSAddr()+`"`); n != 1 {
		t.Errorf("sent over WebSocket = %v, want 1", n)
	}
	waitUntil(t, "deliveries counted", func() error {
		if n := r.metrics.Value("dowse_mapper_sink_sent_total", labels); n != 4 {
			return fmt.Errorf("sent = %v, want 4", n)
		}
		return nil
	})
	// Retained: a subscriber that comes later gets the last reading of pushed at
	// once, and no temperature.
	late := broker.Subscribe(t, "plant/#", 1, "")
	waitUntil(t, "the retained reading", func() error { return want(late, "plant/a/pushed", "6") })
	if n := late.Count("plant/a/temp"); n != 0 {
		t.Errorf("a late subscriber got %d temperatures, published without retain", n)
	}
	if n := sub.Count("label"); n != 0 {
		t.Errorf("a reading was published to a wildcard topic: %q", sub.Lines())
	}
	if n := r.logs.count(`pushMethod.mqtt.topic: \"plant/+/label\": a topic name holds no wildcard`); n == 0 {
		t.Errorf("the wildcard topic was not named in the log")
	}
}
