package link

import (
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// legacyReport is a TwinReportedUpdate as agents wrote it before reported
// values became text: value (3) and observed desired (6) as the old typed
// Value, metadata (5) as map entries.
func legacyReport(value, observed []byte, md map[string]string) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	ref, _ := proto.Marshal(&linkv1.DeviceRef{Namespace: "default", Name: "cam"})
	b = protowire.AppendBytes(b, ref)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, "temp")
	if value != nil {
		b = protowire.AppendTag(b, legacyValue, protowire.BytesType)
		b = protowire.AppendBytes(b, value)
	}
	for k, v := range md {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, v)
		b = protowire.AppendTag(b, legacyMetadata, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	if observed != nil {
		b = protowire.AppendTag(b, legacyObservedDesired, protowire.BytesType)
		b = protowire.AppendBytes(b, observed)
	}
	return b
}

func oldInt(v int64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), uint64(v))
}

func oldDouble(f float64) []byte {
	return protowire.AppendFixed64(protowire.AppendTag(nil, 3, protowire.Fixed64Type), math.Float64bits(f))
}

func oldBool(v bool) []byte {
	return protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), protowire.EncodeBool(v))
}

func oldString(s string) []byte {
	return protowire.AppendString(protowire.AppendTag(nil, 4, protowire.BytesType), s)
}

func oldBytes(b []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, 5, protowire.BytesType), b)
}

func TestUpgradeLegacyReport(t *testing.T) {
	for _, tc := range []struct {
		name            string
		value, observed []byte
		md              map[string]string
		want, wantOD    string
	}{
		{"int", oldInt(-42), oldInt(21), map[string]string{"timestamp": "1700000000123", "type": "int"}, "-42", "21"},
		{"double", oldDouble(21.5), nil, nil, "21.5", ""},
		{"big double", oldDouble(1e21), nil, nil, "1e+21", ""},
		{"float as double", oldDouble(0.1), nil, nil, "0.1", ""},
		{"not finite", oldDouble(math.NaN()), nil, nil, "NaN", ""},
		{"bool", oldBool(true), oldBool(false), nil, "true", "false"},
		{"string", oldString("on"), nil, map[string]string{"error": "read failed"}, "on", ""},
		{"bytes", oldBytes([]byte{1, 2}), nil, nil, "AQI=", ""},
		{"last kind wins", append(oldInt(1), oldString("x")...), nil, nil, "x", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := &linkv1.Envelope{Version: ProtocolVersion, Seq: 7, Kind: &linkv1.Envelope_TwinReported{TwinReported: &linkv1.TwinReportedUpdate{}}}
			frame, err := proto.Marshal(env)
			if err != nil {
				t.Fatal(err)
			}
			// The report's bytes replace the empty one's (field 14 of Envelope).
			frame = protowire.AppendTag(frame[:len(frame)-2], 14, protowire.BytesType)
			frame = protowire.AppendBytes(frame, legacyReport(tc.value, tc.observed, tc.md))
			var got linkv1.Envelope
			if err := Decode(frame, &got); err != nil {
				t.Fatal(err)
			}
			r := got.GetTwinReported()
			if r.GetReported().GetValue() != tc.want || r.GetDevice().GetName() != "cam" || r.GetProperty() != "temp" {
				t.Errorf("reported %v, want %q", r, tc.want)
			}
			for k, v := range tc.md {
				if r.GetReported().GetMetadata()[k] != v {
					t.Errorf("metadata %v, want %v", r.GetReported().GetMetadata(), tc.md)
				}
			}
			if (r.GetObservedDesired() != nil) != (tc.observed != nil) || r.GetObservedDesired().GetValue() != tc.wantOD {
				t.Errorf("observed desired %v, want %q", r.GetObservedDesired(), tc.wantOD)
			}
			if u := r.ProtoReflect().GetUnknown(); len(u) != 0 {
				t.Errorf("unknown fields left: %x", u)
			}
			// Upgraded once, it is a report of today's form.
			again, err := proto.Marshal(&got)
			if err != nil {
				t.Fatal(err)
			}
			var back linkv1.Envelope
			if err := Decode(again, &back); err != nil || !proto.Equal(&back, &got) {
				t.Errorf("round trip: %v, %v", &back, err)
			}
		})
	}
}

// A report in today's form is left as it is, and an old one without a
// value is still refused.
func TestUpgradeLegacyLeavesOthers(t *testing.T) {
	env := twinReported(3, "cam", "temp", 5)
	frame, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	var got linkv1.Envelope
	if err := Decode(frame, &got); err != nil || !proto.Equal(&got, env) {
		t.Fatalf("decoded %v, %v", &got, err)
	}
	empty := &linkv1.Envelope{Version: ProtocolVersion, Seq: 3, Kind: &linkv1.Envelope_TwinReported{TwinReported: &linkv1.TwinReportedUpdate{
		Device: &linkv1.DeviceRef{Name: "cam"}, Property: "temp"}}}
	if frame, err = proto.Marshal(empty); err != nil {
		t.Fatal(err)
	}
	if err := Decode(frame, &got); err == nil {
		t.Fatal("a report without a value was taken")
	}
}
