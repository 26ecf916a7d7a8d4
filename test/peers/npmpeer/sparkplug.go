package npmpeer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

// SparkplugPackages are Eclipse Tahu's Sparkplug B client for Node.js and
// the payload codec it encodes with, pinned; hack/install-npm-peers.sh
// installs them into bin/npm-peers/sparkplug.
var SparkplugPackages = []string{"sparkplug-client@3.2.4", "sparkplug-payload@1.0.3"}

// SparkplugCache is the folder under bin/npm-peers they are installed in.
const SparkplugCache = "sparkplug"

// SparkplugModules returns the node_modules of the Sparkplug peer. It
// never installs: a test without them fails under CI=true and is skipped
// otherwise, saying how to get them.
func SparkplugModules(t testing.TB) string {
	t.Helper()
	return Installed(t, SparkplugCache, SparkplugPackages...)
}

// SparkplugScript is the launcher of the Sparkplug edge node; its first
// lines say what it does.
func SparkplugScript() string {
	return filepath.Join(kube.RepoRoot(), "test", "peers", "npmpeer", "peers", "sparkplug-edge.js")
}

// SparkplugMetric is a metric as Tahu's client takes it: a type name
// ("Int32", "Double", "Boolean", "String"...) and a value.
type SparkplugMetric struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Value any    `json:"value"`
	Alias uint64 `json:"alias,omitempty"`
}

// SparkplugConfig is what the edge node is started with.
type SparkplugConfig struct {
	ServerURL   string                       `json:"serverUrl"`
	GroupID     string                       `json:"groupId"`
	EdgeNode    string                       `json:"edgeNode"`
	ClientID    string                       `json:"clientId,omitempty"`
	Username    string                       `json:"username,omitempty"`
	Password    string                       `json:"password,omitempty"`
	NodeMetrics []SparkplugMetric            `json:"nodeMetrics,omitempty"`
	Devices     map[string][]SparkplugMetric `json:"devices,omitempty"`
}

// SparkplugNode is a running Tahu edge node.
type SparkplugNode struct {
	*Process
	stdin *os.File
}

// StartSparkplug runs a Tahu edge node, waits until it has published its
// births and stops it (by its pid, so without a DEATH of its own: the
// broker publishes its will) when the test ends.
func StartSparkplug(t testing.TB, name string, cfg SparkplugConfig) *SparkplugNode {
	t.Helper()
	modules := SparkplugModules(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr := procs.NewLines(), procs.NewLines()
	stderr.Each = func(line string) { logf(t, "%s stderr: %s", name, line) }
	b, _ := json.Marshal(cfg)
	p, err := procs.Run(name, "node", []string{SparkplugScript(), string(b)}, procs.Options{
		Env: append(os.Environ(), "NODE_PATH="+modules), Stdout: stdout, Stderr: stderr, Stdin: r, DieWithCaller: true,
	})
	r.Close() // the child has its own
	if err != nil {
		w.Close()
		Unavailable(t, "starting node %s: %v", SparkplugScript(), err)
	}
	stdout.EndWith(p)
	n := &SparkplugNode{Process: &Process{Proc: p, stdout: stdout}, stdin: w}
	t.Cleanup(func() { n.Stop(); w.Close() })
	n.WaitLine(t, "BORN", 0, 30*time.Second)
	return n
}

// WaitCommand waits for a DCMD to device printed at or after line from and
// returns its metrics' names, types and values (numbers as JSON decodes
// them, float64).
func (n *SparkplugNode) WaitCommand(t testing.TB, device string, from int, timeout time.Duration) []SparkplugMetric {
	t.Helper()
	line, _ := n.WaitLine(t, "DCMD "+device+" ", from, timeout)
	// Tahu prints an alias as a Long object; it is left out.
	var got []struct {
		Name  string
		Type  string
		Value any
	}
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatalf("%s: DCMD %q: %v", n.Name, line, err)
	}
	ms := make([]SparkplugMetric, len(got))
	for i, m := range got {
		ms[i] = SparkplugMetric{Name: m.Name, Type: m.Type, Value: m.Value}
	}
	return ms
}

// Do sends the edge node one command ({"op": "dbirth", "device": ...}, see
// the launcher) and waits until it was handed to the MQTT client.
func (n *SparkplugNode) Do(t testing.TB, cmd map[string]any) {
	t.Helper()
	from := n.Lines()
	b, _ := json.Marshal(cmd)
	if _, err := n.stdin.Write(append(b, '\n')); err != nil {
		t.Fatalf("%s: writing a command: %v", n.Name, err)
	}
	n.WaitLine(t, "DONE "+cmd["op"].(string), from, 10*time.Second)
}
