package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/controller/lifecycle"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

func agentPods(t *testing.T) lifecycle.Agents {
	t.Helper()
	sel, err := labels.Parse("app.kubernetes.io/name=dowse-agent")
	if err != nil {
		t.Fatal(err)
	}
	return lifecycle.Agents{Reader: suite.Client, Namespace: kube.AgentNamespace, Selector: sel}
}

// TestApplyCRDs: the CRDs embedded in the binary apply server-side over
// the ones installed from deploy/crds, and are served.
func TestApplyCRDs(t *testing.T) {
	if err := lifecycle.ApplyCRDs(context.Background(), suite.Config, testr.New(t)); err != nil {
		t.Fatal(err)
	}
	objs, err := lifecycle.CRDs()
	if err != nil || len(objs) != 4 {
		t.Fatalf("%d CRDs embedded: %v", len(objs), err)
	}
}

// TestAgentJanitor: a Configuration finalizer of an agent with no Pod on
// its node is dropped after the grace period; a running agent's stays.
func TestAgentJanitor(t *testing.T) {
	ns := suite.Namespace(t)
	const node = "janitor-live"
	agentConfig(t, node) // the agent DaemonSet's Pod on the node
	cfg := createConfiguration(t, ns, "janitor", "no-such-handler", "")
	live, gone := v1alpha1.AgentFinalizer(node), v1alpha1.AgentFinalizer("janitor-gone")
	patch := client.MergeFrom(cfg.DeepCopy())
	cfg.Finalizers = []string{live, gone}
	if err := suite.Client.Patch(context.Background(), cfg, patch); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	j := &lifecycle.AgentJanitor{Client: suite.Client, Agents: agentPods(t), GracePeriod: 2 * time.Second, Interval: 200 * time.Millisecond, Log: testr.New(t)}
	go func() { _ = j.Start(ctx) }()
	start := time.Now()
	testwait.For(t, 20*time.Second, func() error {
		var got v1alpha1.Configuration
		if err := suite.Client.Get(context.Background(), keyOf(ns, cfg.Name), &got); err != nil {
			return err
		}
		if !slices.Equal(got.Finalizers, []string{live}) {
			return fmt.Errorf("finalizers %v, want %v", got.Finalizers, []string{live})
		}
		return nil
	})
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("the gone agent's finalizer went after %v, before the grace period", d)
	}
	// The cleanup's delete must not wait for the live one's agent.
	patch = client.MergeFrom(cfg.DeepCopy())
	cfg.Finalizers = nil
	_ = suite.Client.Patch(context.Background(), cfg, patch)
}

// TestUninstall: with an agent and the debug-echo handler running, a
// DeviceModel, and a Configuration kept by the finalizer of an agent that no
// longer runs, Uninstall deletes everything, the agent releases its
// Instances, the gone agent's finalizer is dropped, and nothing is left.
// Uninstall takes the whole cluster's objects: the test has a cluster of
// its own.
func TestUninstall(t *testing.T) {
	suite.Own(t)
	ns := suite.Namespace(t)
	dir := stateDir(t)
	const node = "uninstall-a"
	startAgent(t, node, dir)
	startEcho(t, dir, false)
	echo := createConfiguration(t, ns, "echo", "debug-echo", `{"descriptions": ["foo0", "foo1"]}`)
	expectCount(t, ns, echo.Name, 2, 30*time.Second)
	stuck := createConfiguration(t, ns, "stuck", "no-such-handler", "")
	patch := client.MergeFrom(stuck.DeepCopy())
	stuck.Finalizers = []string{v1alpha1.AgentFinalizer("uninstall-gone")}
	if err := suite.Client.Patch(context.Background(), stuck, patch); err != nil {
		t.Fatal(err)
	}
	model := &v1alpha1.DeviceModel{ObjectMeta: metav1.ObjectMeta{Name: "plc", Namespace: ns}}
	if err := suite.Client.Create(context.Background(), model); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := lifecycle.Uninstall(context.Background(), suite.Client, lifecycle.UninstallOptions{Agents: agentPods(t), Timeout: time.Minute, Poll: 100 * time.Millisecond}, testr.New(t)); err != nil {
		t.Fatal(err)
	}
	t.Logf("uninstalled in %v", time.Since(start).Round(time.Millisecond))
	var cfgs v1alpha1.ConfigurationList
	var insts v1alpha1.InstanceList
	var models v1alpha1.DeviceModelList
	for _, l := range []client.ObjectList{&cfgs, &insts, &models} {
		if err := suite.Client.List(context.Background(), l); err != nil {
			t.Fatal(err)
		}
	}
	if len(cfgs.Items)+len(insts.Items)+len(models.Items) != 0 {
		t.Errorf("left: %d Configurations, %d Instances, %d DeviceModels", len(cfgs.Items), len(insts.Items), len(models.Items))
	}
}
