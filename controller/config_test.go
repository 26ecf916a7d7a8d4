package controller

import (
	"flag"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/controller/link/linkauth"
	"github.com/dowse-dev/dowse/internal/kubeflags"
)

// binary is the Config dowse-controller ran with before its defaults
// moved here (its flags' defaults then), with an empty environment.
var binary = Config{
	Client:                  kubeflags.Client{QPS: 200, Burst: 400},
	Serving:                 kubeflags.Serving{MetricsAddr: ":9745", HealthAddr: ":9746", PprofAddr: "0"},
	LeaderElection:          true,
	LeaderElectionNamespace: "dowse-system",
	// Since then: timed to ride out an API server away a minute.
	LeaseDuration:        2 * time.Minute,
	RenewDeadline:        100 * time.Second,
	RetryPeriod:          5 * time.Second,
	NodeGracePeriod:      5 * time.Minute,
	Namespace:            "dowse-system",
	MapperStateDir:       "/var/lib/dowse",
	AgentServiceAccounts: []string{"dowse-agent"},
	DRA:                  true,
	Link: LinkConfig{
		WebSocketAddr: ":7443", QUICAddr: ":7443", AuthAddr: ":9747",
		CertValidity: 24 * time.Hour, CAValidity: 10 * 365 * 24 * time.Hour,
		Heartbeat: 10 * time.Second, MaxMessageSize: 1 << 20, QueueSize: 16384,
		RateLimit: 2000, RateBurst: 4000, MaxConnections: 20000, MaxStreamsPerNode: 1024, EgressProtocol: "HTTPConnect",
		AuthRateLimit: linkauth.DefaultRequestRate, AuthRateBurst: linkauth.DefaultRequestBurst,
		AgentServiceAccounts: []string{"dowse-system/dowse-agent"},
		TwinStatusInterval:   time.Second, TwinStatusConcurrency: 16,
		TwinStatusBudget: 100, TwinHeartbeatInterval: 3 * time.Minute,
		SpreadInterval: 2 * time.Second, DrainPeriod: 5 * time.Second, MaxClaimsInFlight: 128,
	},
}

func clearEnv(t *testing.T) {
	for _, k := range []string{"POD_NAMESPACE", "POD_NAME"} {
		t.Setenv(k, "")
	}
}

// TestDefaults: a zero Config runs as the binary does, but for the
// switches a zero value leaves off; the flags' defaults are the binary's.
func TestDefaults(t *testing.T) {
	clearEnv(t)
	var zero Config
	zero.setDefaults()
	want := binary
	want.LeaderElection, want.DRA, want.AgentServiceAccounts = false, false, nil
	want.Link.WebSocketAddr, want.Link.QUICAddr, want.Link.AuthAddr, want.Link.AgentServiceAccounts = "", "", "", nil
	if !reflect.DeepEqual(zero, want) {
		t.Errorf("zero Config with defaults:\n%+v\nwant\n%+v", zero, want)
	}

	var flagged Config
	fs := flag.NewFlagSet("dowse-controller", flag.ContinueOnError)
	flagged.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	flagged.setDefaults()
	if !reflect.DeepEqual(flagged, binary) {
		t.Errorf("flags' defaults:\n%+v\nwant\n%+v", flagged, binary)
	}
}

func TestFlags(t *testing.T) {
	clearEnv(t)
	t.Setenv("POD_NAMESPACE", "edge-system")
	var c Config
	fs := flag.NewFlagSet("dowse-controller", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.AddFlags(fs)
	if err := fs.Parse([]string{"--link-hosts=cloud.example, 10.0.0.1,,", "--link-agent-service-accounts=agent,other/agent",
		"--agent-service-accounts=", "--kube-api-qps=50.5", "--leader-elect=false", "--link-drain-period=0"}); err != nil {
		t.Fatal(err)
	}
	c.setDefaults()
	if !reflect.DeepEqual(c.Link.Hosts, []string{"cloud.example", "10.0.0.1"}) {
		t.Errorf("link hosts %q", c.Link.Hosts)
	}
	if !reflect.DeepEqual(c.Link.AgentServiceAccounts, []string{"edge-system/agent", "other/agent"}) {
		t.Errorf("link agent service accounts %q (names without a namespace are in --namespace)", c.Link.AgentServiceAccounts)
	}
	if c.AgentServiceAccounts != nil || c.Client.QPS != 50.5 || c.LeaderElection || c.Namespace != "edge-system" || c.Link.DrainPeriod != -1 {
		t.Errorf("parsed %+v", c)
	}
}
