package agent

import (
	"flag"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/agent/discovery"
	"github.com/dowse-dev/dowse/internal/agent/dra"
	"github.com/dowse-dev/dowse/internal/kubeflags"
)

// binary is the Config dowse-agent ran with before its defaults moved
// here (its flags' defaults then), with an empty environment.
var binary = Config{
	Client:             kubeflags.Client{QPS: 1000, Burst: 2000},
	Serving:            kubeflags.Serving{MetricsAddr: ":9743", HealthAddr: ":9744", PprofAddr: "0"},
	StateDir:           "/var/lib/dowse",
	GracePeriod:        5 * time.Minute,
	MaxDevices:         10000,
	WriteConcurrency:   64,
	DevicePluginDir:    "/var/lib/kubelet/device-plugins",
	DRA:                DRAConfig{RegistrarDir: dra.DefaultRegistrarDir, PluginDir: dra.DefaultPluginDir},
	CDISpecDir:         "/var/run/cdi",
	SlotReclaimGrace:   time.Minute,
	PodResourcesSocket: "/var/lib/kubelet/pod-resources/kubelet.sock",
	Link:               LinkConfig{Transport: "websocket", Heartbeat: 10 * time.Second, StoreMaxEntries: 10000, StoreMaxBytes: 64 << 20},
	HostPaths:          discovery.DefaultHostPaths(),
}

func clearEnv(t *testing.T) {
	for _, k := range []string{"NODE_NAME", "DOWSE_STATE_DIR", "DOWSE_LINK_TOKEN"} {
		t.Setenv(k, "")
	}
}

// TestDefaults: a zero Config runs as the binary does, but for the parts a
// zero value turns off (device plugins, DRA's kubelet plugin); the flags'
// defaults are the binary's.
func TestDefaults(t *testing.T) {
	clearEnv(t)
	var zero Config
	zero.setDefaults()
	want := binary
	want.DevicePluginDir, want.DRA.RegistrarDir = "", ""
	if !reflect.DeepEqual(zero, want) {
		t.Errorf("zero Config with defaults:\n%+v\nwant\n%+v", zero, want)
	}

	var flagged Config
	fs := flag.NewFlagSet("dowse-agent", flag.ContinueOnError)
	flagged.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(flagged, binary) {
		t.Errorf("flags' defaults:\n%+v\nwant\n%+v", flagged, binary)
	}
	// setDefaults leaves what the flags set alone.
	flagged.setDefaults()
	if !reflect.DeepEqual(flagged, binary) {
		t.Errorf("setDefaults changed the flags' defaults:\n%+v", flagged)
	}
}

func TestFlags(t *testing.T) {
	clearEnv(t)
	t.Setenv("NODE_NAME", "edge-1")
	t.Setenv("DOWSE_STATE_DIR", "/run/dowse")
	var c Config
	fs := flag.NewFlagSet("dowse-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.AddFlags(fs)
	if err := fs.Parse([]string{"--max-devices=0", "--handler-grace-period=0", "--slot-reclaim-grace=0", "--link-server=a:1, b:2",
		"--kube-api-qps=2.5", "--kube-api-burst=7", "--device-plugin-dir=", "--metrics-bind-address=0", "--write-concurrency=8"}); err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "edge-1" || c.StateDir != "/run/dowse" {
		t.Errorf("from the environment: node %q, state dir %q", c.NodeName, c.StateDir)
	}
	if c.Client.QPS != 2.5 || c.Client.Burst != 7 || c.DevicePluginDir != "" || c.Serving.MetricsAddr != "0" || c.WriteConcurrency != 8 {
		t.Errorf("parsed %+v", c)
	}
	c.setDefaults()
	// 0 on the command line is none (no cap, no grace, no reclaimer): -1
	// in the Config, whose 0 is the default.
	if c.MaxDevices != -1 || c.GracePeriod != -1 || c.SlotReclaimGrace != -1 || c.DevicePluginDir != "" {
		t.Errorf("0 given for none or an empty device plugin directory did not survive setDefaults: %+v", c)
	}
	if c.Link.Server != "a:1" || !reflect.DeepEqual(c.Link.Servers, []string{"b:2"}) {
		t.Errorf("--link-server a:1, b:2: server %q, more %q", c.Link.Server, c.Link.Servers)
	}
	if err := fs.Parse([]string{"--kube-api-qps=fast"}); err == nil {
		t.Errorf("--kube-api-qps=fast accepted")
	}
}
