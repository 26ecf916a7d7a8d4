package twins

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// TestTwinStatusTrustsNoNode: a node that lies (its agent would refuse
// all of this) reports a property its Device's model lacks, a value not of
// its property's type, a value far too large, metadata by the hundred and
// a time an hour ahead. The cloud keeps only the model's properties with
// values of their type, caps the metadata, takes its own clock for the
// time, says so on the Device (ReportsChecked), and still takes the good
// reading of the same batch; the API server refuses a status the schema
// bounds, whoever writes it.
func TestTwinStatusTrustsNoNode(t *testing.T) {
	ctx := context.Background()
	ns := suite.Namespace(t)
	if err := suite.Client.Create(ctx, thermostatModel(ns)); err != nil {
		t.Fatal(err)
	}
	if err := suite.Client.Create(ctx, device(ns, "liar", "edge-1")); err != nil {
		t.Fatal(err)
	}
	hub := newFakeHub()
	rig := startTwins(t, hub)
	waitValid(t, ns, "liar")
	seq := uint64(0)
	report := func(prop string, v *linkv1.TwinValue, at time.Time) {
		t.Helper()
		seq++
		if err := rig.status.Handle(ctx, cloudhub.Inbound{Node: "edge-1", At: cloudhub.Position{Stream: 5, Seq: seq},
			Env: &linkv1.Envelope{Seq: seq, Kind: &linkv1.Envelope_TwinReported{TwinReported: &linkv1.TwinReportedUpdate{
				Device: &linkv1.DeviceRef{Namespace: ns, Name: "liar"}, Property: prop, Reported: v, Time: timestamppb.New(at)}}}}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	report("temperature", &linkv1.TwinValue{Value: "21.5"}, now)
	for i := range 200 {
		report(fmt.Sprintf("invented-%03d", i), &linkv1.TwinValue{Value: "1"}, now)
	}
	report("setpoint", &linkv1.TwinValue{Value: "twenty"}, now)
	report("label", &linkv1.TwinValue{Value: strings.Repeat("x", 20<<10)}, now)
	md := map[string]string{twinvalue.MetaTimestamp: twinvalue.Timestamp(now.Add(time.Hour))}
	for i := range 300 {
		md[fmt.Sprintf("k%03d", i)] = strings.Repeat("v", 100)
	}
	md["long-value"] = strings.Repeat("v", 10<<10)
	report("setpoint", &linkv1.TwinValue{Value: "22", Metadata: md}, now.Add(time.Hour))
	rig.status.Flush(ctx)

	d, err := getDevice(ns, "liar")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tw := range d.Status.Twins {
		names = append(names, tw.PropertyName)
	}
	if len(d.Status.Twins) != 2 || d.Twin("temperature") == nil || d.Twin("setpoint") == nil {
		t.Fatalf("status twins %v, want temperature and setpoint alone (label's value was too large, the rest are not in the model)", names)
	}
	if v := d.Twin("temperature").Reported.Value; v != "21.5" {
		t.Errorf("temperature %q, want the good reading 21.5", v)
	}
	sp := d.Twin("setpoint").Reported
	if sp.Value != "22" || len(sp.Metadata) > 16 || sp.Metadata["long-value"] != "" {
		t.Errorf("setpoint %q with %d metadata entries (long value kept: %v), want 22 with at most 16", sp.Value, len(sp.Metadata), sp.Metadata["long-value"] != "")
	}
	if ts, ok := twinvalue.TimestampOf(sp.Metadata); !ok || ts.After(time.Now().Add(time.Minute)) {
		t.Errorf("setpoint's timestamp %v: the node's hour ahead was kept", ts)
	}
	if d.Status.LastReportTime == nil || d.Status.LastReportTime.After(time.Now().Add(time.Minute)) {
		t.Errorf("lastReportTime %v: the node's hour ahead was kept", d.Status.LastReportTime)
	}
	c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionReportsChecked)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "TooLarge" || !strings.Contains(c.Message, "edge-1") {
		t.Errorf("ReportsChecked %+v, want False naming the node and the latest refusal (TooLarge)", c)
	}
	if got := hub.committed["edge-1"]; got.Seq != seq {
		t.Errorf("committed %+v, want seq %d: dropped reports are done with, not resent forever", got, seq)
	}

	// The schema's bounds hold against any writer.
	over := d.DeepCopy()
	tw := over.Twin("setpoint")
	tw.Reported.Metadata = map[string]string{}
	for i := range 17 {
		tw.Reported.Metadata[fmt.Sprint(i)] = "x"
	}
	if err := suite.Client.Status().Update(ctx, over); err == nil || !strings.Contains(err.Error(), "metadata") {
		t.Errorf("17 metadata entries written: %v", err)
	}
	over = d.DeepCopy()
	for i := range 513 {
		over.Status.Twins = append(over.Status.Twins, v1alpha1.Twin{PropertyName: fmt.Sprintf("p%d", i), Reported: &v1alpha1.TwinProperty{Value: "1"}})
	}
	if err := suite.Client.Status().Update(ctx, over); err == nil || !strings.Contains(err.Error(), "twins") {
		t.Errorf("515 twins written: %v", err)
	}
}
