package e2e

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestAPIServerAway: a minute without the API server while an edge's
// counters report every 5 ms. The controller and the agent stay up; once
// the API server is back they recover by themselves: the Device's status is
// written again, holding each counter's last value (none went back), and a
// desired value set afterwards is applied. Then etcd restarts under the
// same load, with the same outcome. It says how long recovery took.
func TestAPIServerAway(t *testing.T) {
	ctx := t.Context()
	f := startFleet(t, 1)
	f.join("edge-a")
	testwait.For(t, time.Minute, func() error {
		if n := f.connected()["replica-0"]; n != 1 {
			return fmt.Errorf("replica-0 holds %d sessions", n)
		}
		return nil
	})
	ct := f.counterTwin(t, ctx, "edge-a")
	ct.settled(ctx, "before the outage", "1")

	stopping := time.Now()
	if err := f.cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("the API server took %s to stop", time.Since(stopping).Round(100*time.Millisecond))
	testwait.Holds(t, 60*time.Second, func() error {
		for _, r := range f.replicas {
			if !r.proc.Alive() {
				return fmt.Errorf("%s exited without the API server", r.name)
			}
		}
		for node, a := range f.agents {
			if !a.proc.Alive() {
				return fmt.Errorf("the agent of %s exited without the API server", node)
			}
		}
		return nil
	})
	if err := f.cp.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	testwait.For(t, 2*time.Minute, func() error {
		var d v1alpha1.Device
		if err := f.client.Get(ctx, client.ObjectKeyFromObject(ct.dev), &d); err != nil {
			return err
		}
		if d.Status.LastReportTime == nil || d.Status.LastReportTime.Time.Before(back) {
			return errors.New("the Device's status not written since the API server came back")
		}
		return nil
	})
	t.Logf("after 60 s without the API server, the Device's status written again %s after it came back", time.Since(back).Round(100*time.Millisecond))
	f.waitReady(f.replicas[0])
	set := time.Now()
	ct.setDesired(ctx, "2")
	// The controller's informers waited in their lists and watches for the
	// API server (apiready.HoldListsAndWatches), not in client-go's
	// back-off, which after a minute's outage had them back up to a minute
	// later.
	testwait.For(t, 2*time.Minute, func() error {
		if got := ct.m.Desired("default", ct.dev.Name, "setpoint"); got != "2" {
			return fmt.Errorf("the mapper holds desired %q", got)
		}
		return nil
	})
	t.Logf("a desired value set %s after the API server came back reached the mapper %s later", set.Sub(back).Round(100*time.Millisecond), time.Since(set).Round(100*time.Millisecond))
	ct.settled(ctx, "after the outage", "2")
	t.Logf("a desired value set after the outage applied and every counter at its last value %s after the API server came back", time.Since(back).Round(100*time.Millisecond))

	// etcd restarted under the same load.
	restarted := time.Now()
	if err := f.cp.RestartEtcd(); err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd restarted in %s", time.Since(restarted).Round(100*time.Millisecond))
	etcdBack := time.Now()
	ct.setDesired(ctx, "3")
	testwait.For(t, 2*time.Minute, func() error {
		if got := ct.m.Desired("default", ct.dev.Name, "setpoint"); got != "3" {
			return fmt.Errorf("the mapper holds desired %q", got)
		}
		return nil
	})
	ct.settled(ctx, "after etcd restarted", "3")
	t.Logf("after etcd restarted: a desired value applied and every counter at its last value in %s", time.Since(etcdBack).Round(100*time.Millisecond))
}
