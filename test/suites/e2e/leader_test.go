package e2e

import (
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestLeaderRestartedInItsPod: the leader replica killed with -9 and
// started again under its Pod's name (as the kubelet restarts a container)
// holds the leader Lease under that name and leads again before the Lease
// it held would have expired (2 minutes), instead of the cluster going
// without a leader until then. The soak found it: with controller-runtime's
// host name and random id as the identity, the restarted leader was a
// stranger to its own Lease.
func TestLeaderRestartedInItsPod(t *testing.T) {
	ctx := t.Context()
	f := startFleet(t, 2)
	var leader *replica
	testwait.For(t, time.Minute, func() error {
		if leader = f.leader(); leader == nil {
			return fmt.Errorf("no replica leads")
		}
		return nil
	})
	holder := func() string {
		var l coordinationv1.Lease
		if err := f.client.Get(ctx, client.ObjectKey{Namespace: "dowse-system", Name: "dowse-controller.dowse.dev"}, &l); err != nil {
			return err.Error()
		}
		return ptr.Deref(l.Spec.HolderIdentity, "")
	}
	if h := holder(); h != leader.name {
		t.Fatalf("the leader Lease is held by %q, want the leader's Pod name %q", h, leader.name)
	}
	leader.proc.Kill()
	killed := time.Now()
	f.start(leader)
	testwait.For(t, 90*time.Second, func() error {
		if f.metric(leader, "leader_election_master_status") != 1 {
			return fmt.Errorf("%s, restarted, does not lead; the Lease is held by %q", leader.name, holder())
		}
		return nil
	})
	t.Logf("%s, killed with -9 and restarted, led again %s after the kill", leader.name, time.Since(killed).Round(100*time.Millisecond))
}
