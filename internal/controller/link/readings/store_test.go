package readings

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func key(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }

func TestStoreNewestAndHistory(t *testing.T) {
	s := NewStore(3)
	t0 := time.Unix(1000, 0)
	for i := range 6 {
		s.Observe(key("d"), "n1", "count", strconv.Itoa(i), t0.Add(time.Duration(i)*time.Second))
	}
	// A late value (a resend) goes to the history, the newest stays.
	s.Observe(key("d"), "n1", "count", "late", t0.Add(3500*time.Millisecond))
	// The same value at the same time again changes nothing.
	got, _ := s.Get(key("d"))
	v := got.Version
	s.Observe(key("d"), "n1", "count", "5", t0.Add(5*time.Second))
	if again, _ := s.Get(key("d")); again.Version != v {
		t.Errorf("a repeat of the newest value changed the version %d → %d", v, again.Version)
	}
	p := got.Props[0]
	if p.Value != "5" || !p.At.Equal(t0.Add(5*time.Second)) {
		t.Errorf("newest %s at %v, want 5 at %v", p.Value, p.At, t0.Add(5*time.Second))
	}
	var hist []string
	for _, h := range p.History {
		hist = append(hist, h.Value)
	}
	if want := []string{"3", "late", "4"}; !slices.Equal(hist, want) {
		t.Errorf("history %v, want %v (the last three taken, by read time)", hist, want)
	}
	s.SetState(key("d"), "n1", "ok", t0)
	s.SetState(key("d"), "n1", "offline", t0.Add(-time.Second)) // older: ignored
	if got, _ := s.Get(key("d")); got.State != "ok" {
		t.Errorf("state %q, want ok", got.State)
	}
}

func TestStoreForgetsNodesAndWatchesCoalesce(t *testing.T) {
	s := NewStore(0)
	w := s.Watch("ns", "")
	defer w.Stop()
	other := s.Watch("elsewhere", "")
	defer other.Stop()
	now := time.Now()
	for i := range 100 {
		s.Observe(key("a"), "n1", "count", strconv.Itoa(i), now.Add(time.Duration(i)))
	}
	s.Observe(key("b"), "n2", "count", "1", now)
	select {
	case <-w.Changed():
	default:
		t.Fatal("the watcher was not signalled")
	}
	got := w.Take()
	slices.SortFunc(got, func(a, b types.NamespacedName) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	if want := []types.NamespacedName{key("a"), key("b")}; !slices.Equal(got, want) {
		t.Errorf("changed %v, want %v once each", got, want)
	}
	select {
	case <-other.Changed():
		t.Error("a watcher of another namespace was signalled")
	default:
	}
	s.TakenOver("n1")
	if _, ok := s.Get(key("a")); ok {
		t.Error("a Device of a node taken over is still held")
	}
	if _, ok := s.Get(key("b")); !ok {
		t.Error("a Device of another node was dropped")
	}
	s.Forget(key("b"))
	if s.Len() != 0 {
		t.Errorf("%d Devices held, want none", s.Len())
	}
	if got := w.Take(); !slices.Equal(got, []types.NamespacedName{key("b")}) {
		t.Errorf("after a Device's removal the watcher was told %v, want b (it is gone)", got)
	}
	// A Device moved to another node follows it.
	s.Observe(key("c"), "n1", "count", "1", now)
	s.Observe(key("c"), "n3", "count", "2", now.Add(time.Second))
	s.ForgetNode("n1")
	if _, ok := s.Get(key("c")); !ok {
		t.Error("a Device that moved to n3 was dropped with n1")
	}
}

// BenchmarkObserve is the ingest path: one report of one property of one
// of 100,000 Devices (two properties each, history 8).
func BenchmarkObserve(b *testing.B) {
	const devices = 100_000
	s := NewStore(DefaultHistory)
	keys := make([]types.NamespacedName, devices)
	for i := range keys {
		keys[i] = types.NamespacedName{Namespace: "default", Name: fmt.Sprintf("device-%06d", i)}
	}
	values := make([]string, 1024)
	for i := range values {
		values[i] = strconv.Itoa(20000 + i)
	}
	nodes := make([]string, devices/50)
	for i := range nodes {
		nodes[i] = "node-" + strconv.Itoa(i)
	}
	at := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		k := keys[i%devices]
		prop := "temperature"
		if i&1 == 1 {
			prop = "humidity"
		}
		s.Observe(k, nodes[i%devices/50], prop, values[i%len(values)], at.Add(time.Duration(i)))
	}
}

// TestStoreMemoryPerDevice measures the heap a Device costs with two
// properties and a full history (logged; the bench table uses it).
func TestStoreMemoryPerDevice(t *testing.T) {
	const devices = 20_000
	values := make([]string, 64)
	for i := range values {
		values[i] = strconv.Itoa(20000 + i)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := NewStore(DefaultHistory)
	at := time.Now()
	for i := range devices {
		k := types.NamespacedName{Namespace: "default", Name: fmt.Sprintf("device-%06d", i)}
		node := "node-" + strconv.Itoa(i/50)
		for j := range DefaultHistory + 1 {
			// Fresh strings, as a decoded report's are.
			s.Observe(k, node, "temperature", strings.Clone(values[(i+j)%len(values)]), at.Add(time.Duration(j)*time.Second))
			s.Observe(k, node, "humidity", strings.Clone(values[(i+2*j)%len(values)]), at.Add(time.Duration(j)*time.Second))
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / devices
	t.Logf("%.0f bytes of heap a Device (2 properties, history %d)", per, DefaultHistory)
	if s.Len() != devices {
		t.Fatalf("%d Devices held, want %d", s.Len(), devices)
	}
	runtime.KeepAlive(s)
}
