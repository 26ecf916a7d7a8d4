package readings

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	rv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

func TestMergedTakesTheNewer(t *testing.T) {
	at := time.Unix(2000, 0)
	d := &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "d"}, Spec: v1alpha1.DeviceSpec{NodeName: "n1", DeviceModelRef: &corev1.LocalObjectReference{Name: "m"}},
		Status: v1alpha1.DeviceStatus{State: "ok", Twins: []v1alpha1.Twin{
			{PropertyName: "a", Reported: &v1alpha1.TwinProperty{Value: "1", Metadata: map[string]string{twinvalue.MetaTimestamp: twinvalue.Timestamp(at)}}},
			{PropertyName: "b", Reported: &v1alpha1.TwinProperty{Value: "10", Metadata: map[string]string{twinvalue.MetaTimestamp: twinvalue.Timestamp(at.Add(time.Minute))}}},
		}}}
	s := NewStore(2)
	key := types.NamespacedName{Namespace: "ns", Name: "d"}
	s.Observe(key, "n1", "a", "2", at.Add(time.Second)) // newer than status
	s.Observe(key, "n1", "b", "9", at.Add(time.Second)) // older than status (a late resend)
	s.Observe(key, "n1", "c", "x", at)                  // not in status yet
	snap, _ := s.Get(key)
	live := liveReading(snap, "r0")
	r := merged(d, &live)
	want := map[string]string{"a": "2/live", "b": "10/status", "c": "x/live"}
	for _, p := range r.Properties {
		if got := p.Value + "/" + p.Source; got != want[p.Name] {
			t.Errorf("%s: %s, want %s", p.Name, got, want[p.Name])
		}
	}
	if r.Replica != "r0" || r.State != "ok" || r.Node != "n1" {
		t.Errorf("replica %q state %q node %q", r.Replica, r.State, r.Node)
	}
	if r.ResourceVersion != strconv.FormatInt(at.Add(time.Minute).UnixMicro(), 10) {
		t.Errorf("resourceVersion %s, want the newest read time", r.ResourceVersion)
	}
	tb, err := table([]rv1.DeviceReading{r}, "1", at.Add(2*time.Minute))
	if err != nil || len(tb.Rows) != 1 || tb.Rows[0].Cells[3] != "a=2 b=10 c=x" {
		t.Errorf("table %+v, %v", tb, err)
	}
}

// BenchmarkServeReading is the serving path per Device: its status and its
// live reading merged and encoded as JSON (a list's item, a watch event).
func BenchmarkServeReading(b *testing.B) {
	at := time.Now()
	d := &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "device-000001"}, Spec: v1alpha1.DeviceSpec{NodeName: "node-1"},
		Status: v1alpha1.DeviceStatus{State: "ok", Twins: []v1alpha1.Twin{
			{PropertyName: "temperature", Reported: &v1alpha1.TwinProperty{Value: "21.5", Metadata: map[string]string{twinvalue.MetaTimestamp: twinvalue.Timestamp(at)}}},
			{PropertyName: "humidity", Reported: &v1alpha1.TwinProperty{Value: "40", Metadata: map[string]string{twinvalue.MetaTimestamp: twinvalue.Timestamp(at)}}},
		}}}
	s := NewStore(DefaultHistory)
	key := types.NamespacedName{Namespace: "default", Name: "device-000001"}
	for i := range DefaultHistory + 1 {
		s.Observe(key, "node-1", "temperature", fmt.Sprint(20+i), at.Add(time.Duration(i)*time.Second))
		s.Observe(key, "node-1", "humidity", fmt.Sprint(40+i), at.Add(time.Duration(i)*time.Second))
	}
	b.ReportAllocs()
	var n int
	for b.Loop() {
		snap, _ := s.Get(key)
		live := liveReading(snap, "replica-0")
		r := merged(d, &live)
		out, err := json.Marshal(&r)
		if err != nil {
			b.Fatal(err)
		}
		n = len(out)
	}
	b.ReportMetric(float64(n), "bytes/reading")
}
