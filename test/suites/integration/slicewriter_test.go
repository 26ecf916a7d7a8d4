package integration

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/metadata"
	"k8s.io/utils/ptr"

	"github.com/dowse-dev/dowse/internal/slicewriter"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// sliceState is what the API server holds of one writer's slices: by name,
// the pool, generation, count, first device and resourceVersion.
type sliceState struct {
	pool         string
	gen, count   int64
	devices      []string
	resourceVers string
}

func nodeSlices(t *testing.T, node string) map[string]sliceState {
	t.Helper()
	list, err := suite.Clientset.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, node).String()})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]sliceState{}
	for _, s := range list.Items {
		st := sliceState{pool: s.Spec.Pool.Name, gen: s.Spec.Pool.Generation, count: s.Spec.Pool.ResourceSliceCount, resourceVers: s.ResourceVersion}
		for _, d := range s.Spec.Devices {
			st.devices = append(st.devices, d.Name)
		}
		out[s.Name] = st
	}
	return out
}

// desiredPool is a pool of slices whose slice i holds the devices named
// in names[i].
func desiredPool(names ...[]string) slicewriter.Pool {
	p := slicewriter.Pool{}
	for _, ns := range names {
		p.Slices = append(p.Slices, slicewriter.Slice{Digest: slicewriter.Digest(ns), Devices: func() []resourceapi.Device {
			out := make([]resourceapi.Device, len(ns))
			for i, n := range ns {
				out[i] = resourceapi.Device{Name: n}
			}
			return out
		}})
	}
	return p
}

type runningWriter struct {
	w      *slicewriter.Writer
	writes atomic.Int64
	errs   atomic.Int64
	stop   func()
}

func startSliceWriter(t *testing.T, node string) *runningWriter {
	t.Helper()
	n, err := suite.Clientset.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	meta, err := metadata.NewForConfig(suite.Config)
	if err != nil {
		t.Fatal(err)
	}
	rw := &runningWriter{}
	rw.w, err = slicewriter.New(suite.Clientset.ResourceV1().ResourceSlices(), meta, slicewriter.Options{
		Driver: "test.dowse.dev", NodeName: node,
		Owner:   &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node, UID: n.UID, Controller: ptr.To(true)},
		OnError: func(err error, what string) { rw.errs.Add(1); t.Logf("%s: %v", what, err) },
		OnWrite: func(string) { rw.writes.Add(1) },
	}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	rw.stop = rw.w.Go(context.Background())
	t.Cleanup(rw.stop)
	return rw
}

// TestSliceWriterPoolContract: the writer publishes a pool with its
// generation and slice count in every slice; a change confined to one
// slice updates that slice alone under the same generation; a change of
// two, or a new slice, bumps the generation in every slice; a slice
// deleted behind its back comes back, a foreign one of its node and driver
// goes; a restarted writer finds its slices and writes nothing; a pool no
// longer desired is deleted.
func TestSliceWriterPoolContract(t *testing.T) {
	const node = "slicewriter-node"
	createNode(t, node, true, time.Now())
	rw := startSliceWriter(t, node)
	const pool = "slicewriter-node/pool-a"
	name := func(i int) string { return slicewriter.SliceName(node, pool, i) }
	expect := func(want map[string][]string, gen int64) map[string]sliceState {
		t.Helper()
		var got map[string]sliceState
		testwait.For(t, 20*time.Second, func() error {
			got = nodeSlices(t, node)
			if len(got) != len(want) {
				return fmt.Errorf("%d slices, want %d: %v", len(got), len(want), got)
			}
			for n, devs := range want {
				s, ok := got[n]
				if !ok || fmt.Sprint(s.devices) != fmt.Sprint(devs) || s.gen != gen || s.count != int64(len(want)) || s.pool != pool {
					return fmt.Errorf("slice %s is %+v, want devices %v generation %d count %d", n, s, devs, gen, len(want))
				}
			}
			return nil
		})
		return got
	}
	a, b, c := []string{"a1", "a2"}, []string{"b1"}, []string{"c1"}
	rw.w.Update(map[string]slicewriter.Pool{pool: desiredPool(a, b, c)})
	first := expect(map[string][]string{name(0): a, name(1): b, name(2): c}, 1)

	// One slice changes: updated alone, same generation.
	b2 := []string{"b1", "b2"}
	rw.w.Update(map[string]slicewriter.Pool{pool: desiredPool(a, b2, c)})
	second := expect(map[string][]string{name(0): a, name(1): b2, name(2): c}, 1)
	if second[name(0)].resourceVers != first[name(0)].resourceVers || second[name(2)].resourceVers != first[name(2)].resourceVers {
		t.Error("a change of one slice rewrote others")
	}

	// Two slices change: a new generation everywhere.
	a3, c3 := []string{"a1"}, []string{"c1", "c3"}
	rw.w.Update(map[string]slicewriter.Pool{pool: desiredPool(a3, b2, c3)})
	expect(map[string][]string{name(0): a3, name(1): b2, name(2): c3}, 2)

	// A fourth slice: a new generation, and every count says 4.
	d := []string{"d1"}
	rw.w.Update(map[string]slicewriter.Pool{pool: desiredPool(a3, b2, c3, d)})
	expect(map[string][]string{name(0): a3, name(1): b2, name(2): c3, name(3): d}, 3)

	// A slice deleted behind the writer's back comes back; a foreign
	// slice of the same node and driver goes.
	if err := suite.Clientset.ResourceV1().ResourceSlices().Delete(context.Background(), name(1), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	foreign := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "foreign-" + strconv.Itoa(time.Now().Nanosecond())},
		Spec: resourceapi.ResourceSliceSpec{Driver: "test.dowse.dev", NodeName: ptr.To(node),
			Pool: resourceapi.ResourcePool{Name: "left-behind", Generation: 7, ResourceSliceCount: 1}}}
	if _, err := suite.Clientset.ResourceV1().ResourceSlices().Create(context.Background(), foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	settled := expect(map[string][]string{name(0): a3, name(1): b2, name(2): c3, name(3): d}, 3)

	// A restarted writer with the same pools writes nothing.
	rw.stop()
	rw2 := startSliceWriter(t, node)
	rw2.w.Update(map[string]slicewriter.Pool{pool: desiredPool(a3, b2, c3, d)})
	time.Sleep(2 * time.Second)
	if n := rw2.writes.Load(); n != 0 {
		t.Errorf("a restarted writer made %d writes for unchanged pools", n)
	}
	if after := nodeSlices(t, node); fmt.Sprint(after) != fmt.Sprint(settled) {
		t.Errorf("slices changed on restart: %v, then %v", settled, after)
	}

	// A pool no longer desired goes.
	rw2.w.Update(map[string]slicewriter.Pool{})
	expect(map[string][]string{}, 0)
	if n := rw.errs.Load() + rw2.errs.Load(); n != 0 {
		t.Errorf("%d write errors", n)
	}
}
