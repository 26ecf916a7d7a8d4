// Package dowse starts Dowse's own binaries (from procs.BinDir, that is
// bin/ after `make build`) as processes, for the suites, the benches and
// the demo: one options type per binary, turned into its flags here alone,
// so that a test says what it wants (a replica, a link on these ports, an
// agent that joins with this token) and a renamed flag is fixed once.
//
// Each type's Start runs the binary with its output to a writer (benches,
// the demo); StartLogged runs it for a test, logging to a file that the
// test prints when it fails, and stops it when the test ends.
package dowse

import (
	"fmt"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/procs"
)

// Link is where a controller serves the cloud/edge link, on loopback.
type Link struct {
	// WebSocket and QUIC are the cloudhub's ports; 0 turns a transport off.
	WebSocket, QUIC int
	// Auth is the bootstrap and renewal endpoint's port.
	Auth int
	// Heartbeat is the link's heartbeat; 0 keeps the binary's default.
	Heartbeat time.Duration
}

// FreeLink is a Link on free loopback ports for both transports, with the
// 1 s heartbeat that lets a test see a lost edge within seconds.
func FreeLink() (*Link, error) {
	var ports [3]int
	for i := range ports {
		p, err := procs.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	return &Link{WebSocket: ports[0], QUIC: ports[1], Auth: ports[2], Heartbeat: time.Second}, nil
}

// Edge is how an agent joins l over transport ("websocket" or "quic"),
// before its credentials are set.
func (l *Link) Edge(transport string) *AgentLink {
	port := l.WebSocket
	if transport == "quic" {
		port = l.QUIC
	}
	return &AgentLink{Server: loopback(port), Transport: transport, Heartbeat: l.Heartbeat,
		AuthURL: "https://" + loopback(l.Auth)}
}

// Controller says how to run dowse-controller.
type Controller struct {
	Kubeconfig string
	// PodName, when set, makes this a replica: leader election on, with
	// PodName as its identity; empty, it runs alone without election.
	PodName string
	// Metrics and Health are loopback ports; 0 turns the endpoint off.
	Metrics, Health int
	// Link is where it serves the cloud/edge link; nil: no link.
	Link *Link
	// TwinStatusInterval is --twin-status-interval; 0 keeps the default.
	TwinStatusInterval time.Duration
	// Args are more flags, after these (a later flag wins).
	Args []string
}

// Flags is the controller's command line.
func (c Controller) Flags() []string {
	args := []string{"--kubeconfig", c.Kubeconfig}
	if c.PodName != "" {
		args = append(args, "--leader-elect=true", "--pod-name", c.PodName)
	} else {
		args = append(args, "--leader-elect=false")
	}
	args = append(args, "--metrics-bind-address", loopback(c.Metrics), "--health-probe-bind-address", loopback(c.Health))
	if l := c.Link; l != nil {
		args = append(args, "--link-hosts", "127.0.0.1",
			"--link-websocket-address", addrOrOff(l.WebSocket), "--link-quic-address", addrOrOff(l.QUIC),
			"--link-auth-bind-address", loopback(l.Auth))
		if l.Heartbeat > 0 {
			args = append(args, "--link-heartbeat", l.Heartbeat.String())
		}
	}
	if c.TwinStatusInterval > 0 {
		args = append(args, "--twin-status-interval", c.TwinStatusInterval.String())
	}
	return append(args, c.Args...)
}

// Start runs the controller with its output to out.
func (c Controller) Start(out io.Writer) (*procs.Proc, error) {
	return procs.Start("dowse-controller", out, c.Flags()...)
}

// StartLogged runs the controller for t, logging to dir/logName.log.
func (c Controller) StartLogged(t testing.TB, dir, logName string) *procs.Proc {
	t.Helper()
	return procs.StartLogged(t, dir, "dowse-controller", logName, c.Flags()...)
}

// AgentLink is how an agent joins a controller's link.
type AgentLink struct {
	Server, Transport string
	Heartbeat         time.Duration
	AuthURL           string
	CACertHash        string
	// BootstrapToken or ServiceAccountTokenFile is the agent's first
	// credential: a token from `dowsectl token create`, or its pod's.
	BootstrapToken, ServiceAccountTokenFile string
}

// Agent says how to run dowse-agent.
type Agent struct {
	Kubeconfig, Node, StateDir string
	// Metrics and Health are loopback ports; 0 turns the endpoint off.
	Metrics, Health int
	// DevicePluginDir is the kubelet's device plugin directory; empty: no
	// device plugins, as no kubelet runs beside most tests.
	DevicePluginDir string
	// CDISpecDir, when set, is where the CDI specs go.
	CDISpecDir string
	// Link, when set, joins a controller's link.
	Link *AgentLink
	// Args are more flags, after these (a later flag wins).
	Args []string
}

// Flags is the agent's command line.
func (a Agent) Flags() []string {
	args := []string{"--kubeconfig", a.Kubeconfig, "--node-name", a.Node, "--state-dir", a.StateDir,
		"--device-plugin-dir", a.DevicePluginDir,
		"--metrics-bind-address", loopback(a.Metrics), "--health-probe-bind-address", loopback(a.Health)}
	if a.CDISpecDir != "" {
		args = append(args, "--cdi-spec-dir", a.CDISpecDir)
	}
	if l := a.Link; l != nil {
		args = append(args, "--link-server", l.Server, "--link-transport", l.Transport,
			"--link-auth-url", l.AuthURL, "--link-ca-cert-hash", l.CACertHash)
		if l.Heartbeat > 0 {
			args = append(args, "--link-heartbeat", l.Heartbeat.String())
		}
		if l.BootstrapToken != "" {
			args = append(args, "--link-bootstrap-token", l.BootstrapToken)
		}
		if l.ServiceAccountTokenFile != "" {
			args = append(args, "--link-service-account-token-file", l.ServiceAccountTokenFile)
		}
	}
	return append(args, a.Args...)
}

// Start runs the agent with its output to out.
func (a Agent) Start(out io.Writer) (*procs.Proc, error) {
	return procs.Start("dowse-agent", out, a.Flags()...)
}

// StartLogged runs the agent for t, logging to dir/logName.log.
func (a Agent) StartLogged(t testing.TB, dir, logName string) *procs.Proc {
	t.Helper()
	return procs.StartLogged(t, dir, "dowse-agent", logName, a.Flags()...)
}

// loopback is port on 127.0.0.1, or "0" (the binaries' "off") for 0.
func loopback(port int) string {
	if port == 0 {
		return "0"
	}
	return "127.0.0.1:" + strconv.Itoa(port)
}

// addrOrOff is port on 127.0.0.1, or "" (a cloudhub transport's "off").
func addrOrOff(port int) string {
	if port == 0 {
		return ""
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}
