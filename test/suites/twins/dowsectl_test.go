package twins

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/dowsectl"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDowsectlTwin: set validates against the model and writes the desired
// value; get shows desired, reported and observed desired; watch prints
// each change.
func TestDowsectlTwin(t *testing.T) {
	ctx := context.Background()
	ns := suite.Namespace(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := suite.Kubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := suite.Client.Create(ctx, thermostatModel(ns)); err != nil {
		t.Fatal(err)
	}
	if err := suite.Client.Create(ctx, device(ns, "t1", "edge-1", desired("setpoint", "21"), v1alpha1.DeviceProperty{Name: "temperature"})); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := dowsectl.Run(ctx, append(args, "--kubeconfig", kubeconfig, "-n", ns), &out, &errOut)
		return out.String() + errOut.String(), err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var watched syncBuffer
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- dowsectl.Run(watchCtx, []string{"twin", "watch", "t1", "--kubeconfig", kubeconfig, "-n", ns}, &watched, &watched)
	}()

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"twin", "set", "t1", "setpoint", "31"}, "above the maximum 30"},
		{[]string{"twin", "set", "t1", "setpoint", "warm"}, `"warm" is not an INT`},
		{[]string{"twin", "set", "t1", "temperature", "3"}, "ReadOnly"},
		{[]string{"twin", "set", "t1", "humidity", "3"}, "has no property humidity"},
		{[]string{"twin", "set", "nope", "setpoint", "3"}, "not found"},
	} {
		if out, err := run(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v (out %q), want one saying %q", tc.args, err, out, tc.want)
		}
	}
	if out, err := run("twin", "set", "t1", "setpoint", "25"); err != nil {
		t.Fatalf("set: %v: %s", err, out)
	}
	d, err := getDevice(ns, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if p := d.Property("setpoint"); p.Desired.Value != "25" {
		t.Fatalf("desired %q after set, want 25", p.Desired.Value)
	}
	managed := false
	for _, mf := range d.ManagedFields {
		managed = managed || mf.Manager == dowsectl.TwinFieldManager
	}
	if !managed {
		t.Errorf("no field manager %q in %v", dowsectl.TwinFieldManager, d.ManagedFields)
	}
	// The edge reports (as the twin writer would).
	d.Status.State = "ok"
	d.Status.Twins = []v1alpha1.Twin{
		{PropertyName: "setpoint", Reported: &v1alpha1.TwinProperty{Value: "25", Metadata: map[string]string{"timestamp": fmt.Sprint(time.Now().UnixMilli())}},
			ObservedDesired: &v1alpha1.TwinProperty{Value: "25"}},
		{PropertyName: "temperature", Reported: &v1alpha1.TwinProperty{Value: "19.5"}},
	}
	if err := suite.Client.Status().Update(ctx, d); err != nil {
		t.Fatal(err)
	}
	out, err := run("twin", "get", "t1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"state ok", "setpoint", "25", "temperature", "19.5"} {
		if !strings.Contains(out, want) {
			t.Errorf("get printed %q, missing %q", out, want)
		}
	}
	testwait.For(t, 10*time.Second, func() error {
		for _, want := range []string{"setpoint.desired=25", "setpoint.reported=25", "setpoint.observedDesired=25", "temperature.reported=19.5", "state=ok"} {
			if !strings.Contains(watched.String(), want) {
				return fmt.Errorf("watch printed %q, missing %q", watched.String(), want)
			}
		}
		return nil
	})
	stopWatch()
	if err := <-watchDone; err != nil {
		t.Errorf("watch: %v", err)
	}
}
