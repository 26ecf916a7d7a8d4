package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/internal/agent/slots"
	"github.com/dowse-dev/dowse/internal/instancestore"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// TestSlotRace has two nodes' Claimers race for every slot of one shared
// Instance, many rounds, against the real API server: a slot never has two
// holders, every claim that succeeded is in the status, and every lost race
// is ErrSlotTaken.
func TestSlotRace(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	const rounds, capacity = 25, 3
	nodes := []string{"node-a", "node-b"}
	claimers := map[string]*slots.Claimer{}
	for _, n := range nodes {
		claimers[n] = slots.NewClaimer(suite.Client, n)
	}
	for round := range rounds {
		name := fmt.Sprintf("race-%08x", round)
		inst := &v1alpha1.Instance{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1alpha1.InstanceSpec{
				ConfigurationName: "race", DeviceID: name,
				Shared: true, Capacity: capacity,
			},
		}
		if err := suite.Client.Create(ctx, inst); err != nil {
			t.Fatal(err)
		}
		won := map[string][]string{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Go(func() {
				ids := inst.SlotIDs()
				rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
				for _, id := range ids {
					// Both work from the same stale snapshot: only the API
					// server can tell them apart.
					err := claimers[n].Claim(ctx, inst, []string{id}, "dowse.dev/race")
					switch {
					case err == nil:
						mu.Lock()
						won[id] = append(won[id], n)
						mu.Unlock()
					case errors.Is(err, slots.ErrSlotTaken):
					default:
						t.Errorf("%s claiming %s: %v", n, id, err)
					}
				}
			})
		}
		wg.Wait()
		var cur v1alpha1.Instance
		if err := suite.Client.Get(ctx, keyOf(ns, name), &cur); err != nil {
			t.Fatal(err)
		}
		inStatus := map[string]string{}
		for _, s := range cur.Status.Slots {
			if _, dup := inStatus[s.ID]; dup {
				t.Fatalf("round %d: slot %s listed twice: %+v", round, s.ID, cur.Status.Slots)
			}
			inStatus[s.ID] = s.Node
		}
		for id, holders := range won {
			if len(holders) != 1 {
				t.Fatalf("round %d: slot %s won by %v", round, id, holders)
			}
			if inStatus[id] != holders[0] {
				t.Fatalf("round %d: slot %s won by %s but status says %q", round, id, holders[0], inStatus[id])
			}
		}
		if len(won) != capacity || len(inStatus) != capacity {
			t.Fatalf("round %d: %d slots won, %d in status, want %d", round, len(won), len(inStatus), capacity)
		}
		// The Instance writer's applies (spec and status.nodes under the
		// node's main field manager) leave the slots alone.
		applied, err := instancestore.Apply(ctx, suite.Client, "node-a", &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: inst.Spec})
		if err != nil {
			t.Fatal(err)
		}
		if applied.Status == nil || len(applied.Status.Slots) != capacity {
			t.Fatalf("round %d: the writer's apply left slots %+v", round, applied.Status.Slots)
		}
		// A node claiming again what it holds is a no-op, not an error.
		for id, holders := range won {
			if err := claimers[holders[0]].Claim(ctx, &cur, []string{id}, "dowse.dev/race"); err != nil {
				t.Fatalf("re-claim by holder: %v", err)
			}
		}
	}
}

// TestSlotReclaim frees, after the grace period, the slots no pod uses, and
// keeps the ones in use.
func TestSlotReclaim(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	inst := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: "reclaim-0123abcd", Namespace: ns},
		Spec:       v1alpha1.InstanceSpec{ConfigurationName: "reclaim", DeviceID: "d", Capacity: 2},
	}
	if err := suite.Client.Create(ctx, inst); err != nil {
		t.Fatal(err)
	}
	claimer := slots.NewClaimer(suite.Client, "node-a")
	if err := claimer.Claim(ctx, inst, []string{"0123abcd-0", "0123abcd-1"}, "dowse.dev/reclaim"); err != nil {
		t.Fatal(err)
	}
	r := &slots.Reclaimer{
		InUse: func(context.Context) (map[slots.SlotUse]bool, error) {
			// The other namespace's slot of the same id, under its own
			// resource, does not keep slot 0 in use.
			return map[slots.SlotUse]bool{{Resource: "dowse.dev/reclaim", ID: "0123abcd-1"}: true, {Resource: "dowse.dev/reclaim-0123abcd.other", ID: "0123abcd-0"}: true}, nil
		},
		Claimer: claimer, Node: "node-a", Grace: time.Minute,
		Instances: func() []*v1alpha1.Instance { return []*v1alpha1.Instance{inst} },
		Log:       logr.Discard(),
	}
	now := time.Now()
	for _, at := range []time.Time{now, now.Add(30 * time.Second)} {
		if err := r.Scan(ctx, at); err != nil {
			t.Fatal(err)
		}
		if held := claimer.Held(inst); len(held) != 2 {
			t.Fatalf("freed before the grace period: %v", held)
		}
	}
	if err := r.Scan(ctx, now.Add(61*time.Second)); err != nil {
		t.Fatal(err)
	}
	var cur v1alpha1.Instance
	if err := suite.Client.Get(ctx, keyOf(ns, inst.Name), &cur); err != nil {
		t.Fatal(err)
	}
	if len(cur.Status.Slots) != 1 || cur.Status.Slots[0].ID != "0123abcd-1" {
		t.Fatalf("slots after reclaim = %+v, want only the one in use", cur.Status.Slots)
	}
	// Another node can now claim the freed slot.
	if err := slots.NewClaimer(suite.Client, "node-b").Claim(ctx, &cur, []string{"0123abcd-0"}, "dowse.dev/reclaim"); err != nil {
		t.Fatalf("node-b claiming the freed slot: %v", err)
	}
}
