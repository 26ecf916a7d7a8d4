package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	debugecho "github.com/dowse-dev/dowse/discovery-handlers/debug-echo"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

type echoHandler struct {
	availability string
	cancel       context.CancelFunc
	done         chan error
}

// startEcho runs the real debug-echo handler beside an agent.
func startEcho(t *testing.T, dir string, shared bool) *echoHandler {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &echoHandler{availability: filepath.Join(dir, "availability"), cancel: cancel, done: make(chan error, 1)}
	go func() {
		h.done <- debugecho.Run(ctx, debugecho.Config{StateDir: dir, Shared: shared, AvailabilityFile: h.availability,
			Logger: testr.New(t).WithName("debug-echo")})
	}()
	t.Cleanup(h.stop)
	return h
}

func (h *echoHandler) stop() {
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			panic(fmt.Sprintf("debug-echo ended with %v", err))
		}
	case <-time.After(10 * time.Second):
		panic("debug-echo did not stop")
	}
}

func (h *echoHandler) set(t *testing.T, state string) {
	t.Helper()
	if err := os.WriteFile(h.availability+".tmp", []byte(state), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(h.availability+".tmp", h.availability); err != nil {
		t.Fatal(err)
	}
}

func expectNodes(t *testing.T, ns, cfg string, want map[string][]string) {
	t.Helper()
	testwait.For(t, 10*time.Second, func() error {
		got := listInstances(t, ns, cfg)
		if len(got) != len(want) {
			return fmt.Errorf("have %v, want %d instances", got, len(want))
		}
		for _, v := range got {
			key := v.DeviceID
			if _, shared := want[key]; !shared {
				key = v.DeviceID + "@" + strings.Join(v.Nodes, ",")
			}
			if !reflect.DeepEqual(v.Nodes, want[key]) {
				return fmt.Errorf("%s (%s): nodes %v, want %v (all: %v)", v.Name, v.DeviceID, v.Nodes, want[key], got)
			}
		}
		return nil
	})
}

func TestDebugEchoSharedAndLocalAcrossTwoNodes(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	b := startAgent(t, "node-b", stateDir(t))
	// One shared handler and one local handler per node, as a DaemonSet would run them.
	sharedDirA, sharedDirB := a.stateDir, b.stateDir
	ea := startEcho(t, sharedDirA, true)
	eb := startEcho(t, sharedDirB, true)
	createConfiguration(t, ns, "echo", "debug-echo", `{"descriptions":["foo0","foo1"]}`)
	expectNodes(t, ns, "echo", map[string][]string{"foo0": {"node-a", "node-b"}, "foo1": {"node-a", "node-b"}})

	// OFFLINE on one node: that node drops out, the Instances stay.
	ea.set(t, "OFFLINE")
	expectNodes(t, ns, "echo", map[string][]string{"foo0": {"node-b"}, "foo1": {"node-b"}})
	// OFFLINE everywhere: the Instances go.
	eb.set(t, "OFFLINE")
	expectNodes(t, ns, "echo", map[string][]string{})
	// ONLINE brings them back under the same names.
	ea.set(t, "ONLINE")
	eb.set(t, "ONLINE")
	expectNodes(t, ns, "echo", map[string][]string{"foo0": {"node-a", "node-b"}, "foo1": {"node-a", "node-b"}})
}

func TestDebugEchoLocalDeviceOneInstancePerNode(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	b := startAgent(t, "node-b", stateDir(t))
	startEcho(t, a.stateDir, false)
	eb := startEcho(t, b.stateDir, false)
	createConfiguration(t, ns, "usb", "debug-echo", `{"descriptions":["ttyUSB0"]}`)
	want := map[string][]string{"ttyUSB0@node-a": {"node-a"}, "ttyUSB0@node-b": {"node-b"}}
	expectNodes(t, ns, "usb", want)
	got := listInstances(t, ns, "usb")
	if got[0].Name == got[1].Name {
		t.Fatalf("local devices on two nodes share the name %s", got[0].Name)
	}
	eb.set(t, "OFFLINE")
	expectNodes(t, ns, "usb", map[string][]string{"ttyUSB0@node-a": {"node-a"}})
}

func TestAgentRestartMakesNoDuplicateAndNoWrite(t *testing.T) {
	ns := suite.Namespace(t)
	dir := stateDir(t)
	a := startAgent(t, "node-a", dir)
	startEcho(t, dir, true)
	createConfiguration(t, ns, "restart", "debug-echo", `{"descriptions":["r0","r1","r2"]}`)
	want := map[string][]string{"r0": {"node-a"}, "r1": {"node-a"}, "r2": {"node-a"}}
	expectNodes(t, ns, "restart", want)
	testwait.For(t, 10*time.Second, func() error {
		st := nodeStatus(t, ns, "restart", "node-a")
		if st == nil || st.Devices != 3 {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	before := listInstances(t, ns, "restart")
	a.stop()

	// The same node's agent comes back; the handler notices the new
	// registration socket and registers again by itself.
	a2 := startAgent(t, "node-a", dir)
	testwait.For(t, 10*time.Second, func() error {
		st := nodeStatus(t, ns, "restart", "node-a")
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHandlerAvailable)
		if c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("handler condition %+v", c)
		}
		return nil
	})
	// Give the new agent time to see the handler's list and compare it.
	consistently(t, 3*time.Second, func() error {
		if w := a2.requests.writes.Load(); w != 0 {
			return fmt.Errorf("restarted agent made %d writes", w)
		}
		return nil
	})
	if after := listInstances(t, ns, "restart"); !reflect.DeepEqual(before, after) {
		t.Fatalf("instances changed across the restart:\nbefore %v\nafter  %v", before, after)
	}
	// And it is live: a change still goes through.
	var cfg v1alpha1.Configuration
	if err := suite.Client.Get(context.Background(), keyOf(ns, "restart"), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Spec.DiscoveryHandler.DiscoveryDetails.Raw = []byte(`{"descriptions":["r0","r1"]}`)
	if err := suite.Client.Update(context.Background(), &cfg); err != nil {
		t.Fatal(err)
	}
	expectNodes(t, ns, "restart", map[string][]string{"r0": {"node-a"}, "r1": {"node-a"}})
}

func TestMalformedDetailsAreReportedAndDisturbNothing(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	startEcho(t, a.stateDir, true)
	createConfiguration(t, ns, "good", "debug-echo", `{"descriptions":["g0"]}`)
	createConfiguration(t, ns, "bad", "debug-echo", `{"descriptions":["x", ""]}`)
	createConfiguration(t, ns, "typo", "debug-echo", `{"descripshuns":["x"]}`)
	for name, want := range map[string]string{"bad": "descriptions[1]", "typo": "descripshuns"} {
		testwait.For(t, 10*time.Second, func() error {
			st := nodeStatus(t, ns, name, "node-a")
			if st == nil {
				return errPending
			}
			c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDiscovering)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "InvalidDetails" || !strings.Contains(c.Message, want) {
				return fmt.Errorf("%s: condition %+v, want InvalidDetails naming %s", name, c, want)
			}
			return nil
		})
	}
	expectNodes(t, ns, "good", map[string][]string{"g0": {"node-a"}})
	if n := len(listInstances(t, ns, "bad")) + len(listInstances(t, ns, "typo")); n != 0 {
		t.Fatalf("%d instances from bad configurations", n)
	}
	// Fixing the details starts discovery.
	var cfg v1alpha1.Configuration
	if err := suite.Client.Get(context.Background(), keyOf(ns, "bad"), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Spec.DiscoveryHandler.DiscoveryDetails.Raw = []byte(`{"descriptions":["x","y"]}`)
	if err := suite.Client.Update(context.Background(), &cfg); err != nil {
		t.Fatal(err)
	}
	expectNodes(t, ns, "bad", map[string][]string{"x": {"node-a"}, "y": {"node-a"}})
	testwait.For(t, 10*time.Second, func() error {
		c := meta.FindStatusCondition(nodeStatus(t, ns, "bad", "node-a").Conditions, v1alpha1.ConditionDiscovering)
		if c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
}
