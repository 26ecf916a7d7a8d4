package twins

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// FuzzReportShapes feeds any TwinReportedUpdate (protobuf, as a node could
// send it) to checkReport: it never panics; a report it takes is of a
// model property with a value of its type and bounded size, at most 16
// bounded metadata entries with a timestamp, and a time not ahead of the
// cloud's clock; one it drops says why.
func FuzzReportShapes(f *testing.F) {
	now := time.Now()
	for _, r := range []*linkv1.TwinReportedUpdate{
		{Property: "t", Reported: &linkv1.TwinValue{Value: "21.5"}, Time: timestamppb.New(now)},
		{Property: "n", Reported: &linkv1.TwinValue{Value: "7", Metadata: map[string]string{"timestamp": "1", "a": "b"}}, ObservedDesired: &linkv1.TwinValue{Value: "x"}},
		{Property: "x", Reported: &linkv1.TwinValue{Value: "1"}, Time: timestamppb.New(now.Add(time.Hour))},
		{Property: "b", Reported: &linkv1.TwinValue{Value: "not base64!"}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	model := &v1alpha1.DeviceModel{}
	model.Name = "m"
	model.Spec.Properties = []v1alpha1.ModelProperty{
		{Name: "t", Type: v1alpha1.PropertyDouble}, {Name: "n", Type: v1alpha1.PropertyInt},
		{Name: "s", Type: v1alpha1.PropertyString}, {Name: "b", Type: v1alpha1.PropertyType("BYTES")},
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r linkv1.TwinReportedUpdate
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		now := time.Now()
		c := checkReport(model, &r, "edge", now)
		if c.refused != "" {
			if c.reported != nil || c.message == "" {
				t.Fatalf("dropped (%s) with reported %v, message %q", c.refused, c.reported, c.message)
			}
			return
		}
		var typ twinvalue.Type
		for _, p := range model.Spec.Properties {
			if p.Name == r.GetProperty() {
				typ = twinvalue.Type(p.Type)
			}
		}
		if typ == "" {
			t.Fatalf("took property %q, which the model lacks", r.GetProperty())
		}
		if _, err := twinvalue.Parse(typ, c.reported.Value); err != nil || len(c.reported.Value) > maxReportedValue {
			t.Fatalf("took value %q of %s: %v", c.reported.Value, typ, err)
		}
		if len(c.reported.Metadata) > maxMetadataKeys {
			t.Fatalf("%d metadata entries", len(c.reported.Metadata))
		}
		for k, v := range c.reported.Metadata {
			if len(k) > maxMetadataKey || len(v) > maxMetadataValue {
				t.Fatalf("metadata %q: %q past its bounds", k, v)
			}
		}
		ts, ok := twinvalue.TimestampOf(c.reported.Metadata)
		if !ok || ts.After(now.Add(futureSkew)) || c.at.After(now.Add(futureSkew)) {
			t.Fatalf("time %v, timestamp %v (%v): ahead of the cloud's clock", c.at, ts, ok)
		}
		if c.observed != nil {
			if _, err := twinvalue.Parse(typ, c.observed.Value); err != nil {
				t.Fatalf("took observed desired %q of %s: %v", c.observed.Value, typ, err)
			}
		}
	})
}
