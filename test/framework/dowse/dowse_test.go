package dowse

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/controller"
)

// The command lines parse with the binaries' own flag sets, so that a
// renamed flag fails here rather than as a process that will not start.
func TestFlagsParse(t *testing.T) {
	link := &Link{WebSocket: 7001, Auth: 7003, Heartbeat: time.Second}
	var c controller.Config
	fs := flag.NewFlagSet("dowse-controller", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.AddFlags(fs)
	if err := fs.Parse(Controller{Kubeconfig: "kc", PodName: "r0", Link: link, Args: []string{"--dra=false"}}.Flags()); err != nil {
		t.Fatalf("controller: %v", err)
	}
	if c.Client.Kubeconfig != "kc" || !c.LeaderElection || c.PodName != "r0" || c.DRA ||
		c.Link.WebSocketAddr != "127.0.0.1:7001" || c.Link.QUICAddr != "" || c.Link.AuthAddr != "127.0.0.1:7003" ||
		c.Link.Heartbeat != time.Second || c.Serving.MetricsAddr != "0" || c.Serving.HealthAddr != "0" {
		t.Errorf("controller parsed as %+v", c)
	}

	edge := link.Edge("websocket")
	edge.BootstrapToken, edge.CACertHash = "abc.def", "sha256:00"
	var a agent.Config
	fs = flag.NewFlagSet("dowse-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a.AddFlags(fs)
	if err := fs.Parse(Agent{Kubeconfig: "kc", Node: "n1", StateDir: "/s", Metrics: 7004, Link: edge}.Flags()); err != nil {
		t.Fatalf("agent: %v", err)
	}
	if a.NodeName != "n1" || a.StateDir != "/s" || a.DevicePluginDir != "" || a.Serving.MetricsAddr != "127.0.0.1:7004" ||
		a.Link.Server != "127.0.0.1:7001" || a.Link.Transport != "websocket" || a.Link.AuthURL != "https://127.0.0.1:7003" ||
		a.Link.Heartbeat != time.Second || a.Link.Token != "abc.def" || a.Link.CAPin != "sha256:00" {
		t.Errorf("agent parsed as %+v", a)
	}
}
