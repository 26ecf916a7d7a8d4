package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/agent"
	debugecho "github.com/dowse-dev/dowse/discovery-handlers/debug-echo"
	"github.com/dowse-dev/dowse/internal/agent/deviceplugin"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/kube"
)

// dowseOnNode is Dowse's agent and debug-echo handler running in this
// process against a real node.
type dowseOnNode struct {
	t      *testing.T
	c      *cluster.Cluster
	cl     client.Client
	state  string
	runCtx context.Context
	// agentConfig is the agent's credentials: its pod's token.
	agentConfig *rest.Config
	// reg holds the running agent's metrics.
	reg *prometheus.Registry
	// stopAgent stops the running agent (idempotent).
	stopAgent func()
}

// startDowse applies the CRDs and starts the debug-echo handler; startAgent
// starts the agent. Both stop before the cluster does (cleanups run last-in
// first-out), so register the cluster's cleanup first.
func startDowse(t *testing.T, ctx context.Context, c *cluster.Cluster) *dowseOnNode {
	t.Helper()
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.Config, client.Options{Scheme: sch})
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.InstallCRDs(c.Config); err != nil {
		t.Fatal(err)
	}
	// The agent runs as the DaemonSet's would: under its pod's token, with
	// deploy/agent's RBAC and node admission policy.
	if err := kube.InstallAgentAccess(ctx, c.Config); err != nil {
		t.Fatal(err)
	}
	agentCfg, err := kube.AgentConfig(ctx, c.Config, c.NodeName)
	if err != nil {
		t.Fatal(err)
	}
	d := &dowseOnNode{agentConfig: agentCfg, t: t, c: c, cl: cl, state: filepath.Join(c.StateDir, "dowse"), stopAgent: func() {}}
	if err := os.MkdirAll(d.state, 0o755); err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	d.runCtx = runCtx
	handlerDone := make(chan error, 1)
	go func() {
		handlerDone <- debugecho.Run(runCtx, debugecho.Config{StateDir: d.state, Logger: testr.New(t).WithName("debug-echo")})
	}()
	t.Cleanup(func() {
		d.stopAgent()
		stopRun()
		// The handler may report its server stopping as an error: only log.
		if err := <-handlerDone; err != nil {
			t.Logf("debug-echo: %v", err)
		}
	})
	return d
}

// startAgent runs an agent (with the classic Allocate answer when classic)
// until d.stopAgent.
func (d *dowseOnNode) startAgent(classic bool) {
	t := d.t
	actx, acancel := context.WithCancel(d.runCtx)
	done := make(chan error, 1)
	d.reg = prometheus.NewRegistry()
	reg := d.reg
	go func() {
		done <- agent.Run(actx, agent.Config{
			SkipNameValidation: true,
			RESTConfig:         rest.CopyConfig(d.agentConfig), NodeName: d.c.NodeName, StateDir: d.state,
			GracePeriod: time.Minute, WriteConcurrency: 4, Serving: kubeflags.Off(),
			Registerer:      reg,
			DevicePluginDir: deviceplugin.DefaultDir, CDISpecDir: d.c.CDIDir, ClassicAllocate: classic,
			SlotReclaimGrace: 2 * time.Second, SlotReclaimInterval: time.Second,
			// The cluster's kubelet has a root directory of its own.
			PodResourcesSocket: filepath.Join(d.c.StateDir, "kubelet", "pod-resources", "kubelet.sock"),
		}, testr.New(t).WithName("agent"))
	}()
	var stopped bool
	d.stopAgent = func() {
		if stopped {
			return
		}
		stopped = true
		acancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}
}

// setAvailability flips the debug-echo handler's devices on or off.
func (d *dowseOnNode) setAvailability(online bool) {
	d.t.Helper()
	v := "OFFLINE"
	if online {
		v = "ONLINE"
	}
	if err := os.WriteFile(filepath.Join(d.state, debugecho.DefaultAvailabilityFileName), []byte(v), 0o644); err != nil {
		d.t.Fatal(err)
	}
}
