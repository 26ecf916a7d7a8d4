package readings

import (
	"strconv"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	rv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
)

func reading(name string, created time.Time, read time.Time) rv1.DeviceReading {
	r := rv1.DeviceReading{TypeMeta: typeMeta, ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
		CreationTimestamp: metav1.NewTime(created.Truncate(time.Second)), Labels: map[string]string{"site": "a"}},
		Properties: []rv1.PropertyReading{{Name: "p", Value: "1", Time: metav1.NewMicroTime(read), Source: rv1.SourceLive}}}
	r.ResourceVersion = versionOf(&r)
	return r
}

// A watch from a list's resourceVersion gets what was read after it, what
// a replica took after it (less the margin) whenever it was read, the
// Devices created since as ADDED and those deleted since as DELETED;
// nothing else.
func TestReplaySendsWhatCameAfter(t *testing.T) {
	base := time.Unix(5000, 0)
	list := base.Add(10 * time.Second) // the list's resourceVersion
	rv := list.UnixMicro()
	items := []rv1.DeviceReading{
		reading("old", base, base.Add(time.Second)),                            // read and taken before: the client has it
		reading("read-after", base, list.Add(time.Millisecond)),                // read after the list
		reading("taken-after", base, base.Add(-time.Hour)),                     // read an hour ago, taken after the list (an edge that was offline)
		reading("in-flight", base, list.Add(-2*time.Second)),                   // read before, taken within the margin
		reading("new", list.Add(3*time.Second), list.Add(4*time.Second)),       // created after the list
		reading("new-quiet", list.Add(3*time.Second), time.Time{}),             // created after, nothing read yet
		reading("recreated", list.Add(2*time.Second), list.Add(2*time.Second)), // deleted and created again since
	}
	taken := map[types.NamespacedName]int64{
		{Namespace: "ns", Name: "old"}:         base.Add(time.Second).UnixMicro(),
		{Namespace: "ns", Name: "taken-after"}: list.Add(time.Second).UnixMicro(),
		{Namespace: "ns", Name: "in-flight"}:   list.Add(-time.Second).UnixMicro(),
	}
	gone := []tombstone{
		{key: types.NamespacedName{Namespace: "ns", Name: "deleted"}, labels: map[string]string{"site": "a"}, created: base.UnixMicro(), at: list.Add(time.Second).UnixMicro()},
		{key: types.NamespacedName{Namespace: "ns", Name: "other-site"}, labels: map[string]string{"site": "b"}, created: base.UnixMicro(), at: list.Add(time.Second).UnixMicro()},
		{key: types.NamespacedName{Namespace: "other", Name: "deleted"}, labels: map[string]string{"site": "a"}, created: base.UnixMicro(), at: list.Add(time.Second).UnixMicro()},
		{key: types.NamespacedName{Namespace: "ns", Name: "born-and-gone"}, created: list.Add(2 * time.Second).UnixMicro(), at: list.Add(3 * time.Second).UnixMicro()},
		{key: types.NamespacedName{Namespace: "ns", Name: "recreated"}, labels: map[string]string{"site": "a"}, created: base.UnixMicro(), at: list.Add(time.Second).UnixMicro()},
	}
	sel, _ := labels.Parse("site=a")
	got := map[string]string{}
	for _, ev := range replay(items, taken, gone, rv, DefaultReplayMargin, "ns", "", sel) {
		if _, dup := got[ev.obj.Name]; dup {
			t.Errorf("%s sent twice", ev.obj.Name)
		}
		got[ev.obj.Name] = ev.typ
		if ev.typ == "DELETED" {
			if v, _ := strconv.ParseInt(ev.obj.ResourceVersion, 10, 64); v <= rv {
				t.Errorf("DELETED %s at resourceVersion %s, not after the list's %d", ev.obj.Name, ev.obj.ResourceVersion, rv)
			}
		}
	}
	want := map[string]string{"read-after": "MODIFIED", "taken-after": "MODIFIED", "in-flight": "MODIFIED",
		"new": "ADDED", "new-quiet": "ADDED", "recreated": "ADDED", "deleted": "DELETED"}
	if len(got) != len(want) {
		t.Errorf("replayed %v, want %v", got, want)
	}
	for name, typ := range want {
		if got[name] != typ {
			t.Errorf("%s: %q, want %q (all: %v)", name, got[name], typ, got)
		}
	}
}

// Deletions are remembered for a window (and up to a number); a
// resourceVersion before the oldest one forgotten, or before the replica
// followed the Devices at all, cannot be answered.
func TestDeletionsBoundReplays(t *testing.T) {
	d := &deletions{window: time.Minute, max: 3}
	if _, ok := d.after(1); ok {
		t.Fatal("answerable before the Devices are followed")
	}
	start := time.Unix(1000, 0).UnixMicro()
	d.follows(start)
	if _, ok := d.after(start - 1); ok {
		t.Error("answerable before the start")
	}
	at := func(s int) int64 { return start + int64(s)*1_000_000 }
	for i, s := range []int{1, 2, 3} {
		d.add(tombstone{key: types.NamespacedName{Name: strconv.Itoa(i)}, at: at(s)})
	}
	if got, ok := d.after(at(1)); !ok || len(got) != 2 {
		t.Errorf("after 1 s: %d, %v", len(got), ok)
	}
	d.add(tombstone{key: types.NamespacedName{Name: "4"}, at: at(4)}) // beyond max: the first is forgotten
	if _, ok := d.after(at(1) - 1); ok {
		t.Error("answerable before a forgotten deletion")
	}
	if got, ok := d.after(at(1)); !ok || len(got) != 3 {
		t.Errorf("after the forgotten one: %d, %v", len(got), ok)
	}
	d.add(tombstone{key: types.NamespacedName{Name: "5"}, at: at(100)}) // the window drops the rest
	if _, ok := d.after(at(4) - 1); ok {
		t.Error("answerable before deletions the window dropped")
	}
	if got, ok := d.after(at(4)); !ok || len(got) != 1 {
		t.Errorf("after the window: %d, %v", len(got), ok)
	}
	if err := tooOld(at(0), d.since); err == nil || !isExpired(err) {
		t.Errorf("too old: %v", err)
	}
}

// isExpired: what client-go's reflector relists on (410, reason Expired).
func isExpired(err error) bool {
	return apierrors.IsResourceExpired(err) && err.(apierrors.APIStatus).Status().Code == 410
}
