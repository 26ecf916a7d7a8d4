package link

import (
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// The fields of TwinReportedUpdate that agents wrote before reported values
// became text (now reserved): the value as a typed oneof, its metadata, and
// the observed desired value typed.
const (
	legacyValue           protowire.Number = 3
	legacyMetadata        protowire.Number = 5
	legacyObservedDesired protowire.Number = 6
)

// UpgradeLegacy rewrites a TwinReportedUpdate in env that an older agent
// wrote (its value typed, in fields now reserved) in the current form,
// the value as the text Device.status shows. Such a report arrives two
// ways, both of which call this: on the wire from an agent not yet
// upgraded (Decode), and from an edge store an older agent wrote (the
// agent's store, at load). Any other envelope is left as it is, at the cost
// of one length check.
func UpgradeLegacy(env *linkv1.Envelope) {
	r := env.GetTwinReported()
	if r == nil {
		return
	}
	unknown := r.ProtoReflect().GetUnknown()
	if len(unknown) == 0 {
		return
	}
	var (
		rest              []byte
		metadata          map[string]string
		hasValue, hasOD   bool
		valueText, odText string
	)
	for b := unknown; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return // not ours to mend: leave the message as decoded
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return
		}
		field := b[:n+m]
		body := b[n : n+m]
		b = b[n+m:]
		if typ != protowire.BytesType {
			rest = append(rest, field...)
			continue
		}
		v, _ := protowire.ConsumeBytes(body)
		switch num {
		case legacyValue:
			valueText, hasValue = legacyText(v), true
		case legacyObservedDesired:
			odText, hasOD = legacyText(v), true
		case legacyMetadata:
			k, val := legacyEntry(v)
			if metadata == nil {
				metadata = map[string]string{}
			}
			metadata[k] = val
		default:
			rest = append(rest, field...)
		}
	}
	if hasValue && r.Reported == nil {
		r.Reported = &linkv1.TwinValue{Value: valueText, Metadata: metadata}
	}
	if hasOD && r.ObservedDesired == nil {
		r.ObservedDesired = &linkv1.TwinValue{Value: odText}
	}
	r.ProtoReflect().SetUnknown(rest)
}

// legacyText reads an old typed Value (oneof: bool 1, int64 2, double 3,
// string 4, bytes 5; the last one set wins, as protobuf's oneofs do) and
// writes it as the controller wrote such values into Device.status: the
// twin text of its kind, or as Go prints it when no twin text holds it (a
// non-finite number, which agents refused from mappers). "" when unset.
func legacyText(b []byte) string {
	var (
		t twinvalue.Type
		x any
	)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return ""
			}
			t, x, n = twinvalue.Boolean, v != 0, m
		case num == 2 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return ""
			}
			t, x, n = twinvalue.Int, int64(v), m
		case num == 3 && typ == protowire.Fixed64Type:
			v, m := protowire.ConsumeFixed64(b)
			if m < 0 {
				return ""
			}
			t, x, n = twinvalue.Double, math.Float64frombits(v), m
		case num == 4 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return ""
			}
			t, x, n = twinvalue.String, string(v), m
		case num == 5 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return ""
			}
			t, x, n = twinvalue.Bytes, append([]byte(nil), v...), m
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return ""
			}
		}
		b = b[n:]
	}
	if t == "" {
		return ""
	}
	s, err := twinvalue.Format(t, x)
	if err != nil {
		return fmt.Sprint(x)
	}
	return s
}

// legacyEntry reads a map<string, string> entry (key 1, value 2).
func legacyEntry(b []byte) (key, value string) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return key, value
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return key, value
			}
			b = b[n:]
			continue
		}
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return key, value
		}
		switch num {
		case 1:
			key = string(v)
		case 2:
			value = string(v)
		}
		b = b[m:]
	}
	return key, value
}
