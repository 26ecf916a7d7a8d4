package mapper

import (
	"encoding/hex"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

func TestDecodeConfigAcceptsEveryPacking(t *testing.T) {
	st, _ := structpb.NewStruct(map[string]any{"host": "10.0.0.1", "port": 502, "tls": map[string]any{"insecure": true}})
	list, _ := structpb.NewList([]any{1, "two"})
	wrap := func(v any) *anypb.Any {
		var a *anypb.Any
		var err error
		switch x := v.(type) {
		case *wrapperspb.StringValue:
			a, err = anypb.New(x)
		case *wrapperspb.FloatValue:
			a, err = anypb.New(x)
		case *wrapperspb.Int32Value:
			a, err = anypb.New(x)
		case *wrapperspb.Int64Value:
			a, err = anypb.New(x)
		case *wrapperspb.DoubleValue:
			a, err = anypb.New(x)
		case *wrapperspb.BoolValue:
			a, err = anypb.New(x)
		case *wrapperspb.UInt32Value:
			a, err = anypb.New(x)
		case *structpb.Struct:
			a, err = anypb.New(x)
		case *structpb.ListValue:
			a, err = anypb.New(x)
		}
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	cv := &dmiv1beta1.CustomizedValue{Data: map[string]*anypb.Any{
		// edgecore: every JSON number is a FloatValue.
		"scale":   wrap(wrapperspb.Float(0.1)),
		"port":    wrap(wrapperspb.Float(502)),
		"slaveID": wrap(wrapperspb.Int32(3)),
		"address": wrap(wrapperspb.Int64(40001)),
		"offset":  wrap(wrapperspb.Double(-2.5)),
		"swap":    wrap(wrapperspb.Bool(true)),
		"count":   wrap(wrapperspb.UInt32(7)),
		"text":    wrap(wrapperspb.String("502")),
		"nested":  wrap(st),
		"json":    wrap(wrapperspb.String(`{"a": 1, "b": "x"}`)),
		"list":    wrap(list),
		"timeout": wrap(wrapperspb.String("250ms")),
		"ms":      wrap(wrapperspb.Float(1500)),
	}}
	p, err := DecodeConfig(cv)
	if err != nil {
		t.Fatal(err)
	}
	if f, _ := p.Float("scale", 0); f != 0.1 {
		t.Errorf("scale = %v, want 0.1 (float32 read as its shortest decimal)", f)
	}
	for key, want := range map[string]int64{"port": 502, "slaveId": 3, "address": 40001, "count": 7, "text": 502} {
		if n, err := p.Int(key, 0); err != nil || n != want {
			t.Errorf("Int(%s) = %d, %v; want %d", key, n, err, want)
		}
	}
	if f, _ := p.Float("offset", 0); f != -2.5 {
		t.Errorf("offset = %v", f)
	}
	if b, _ := p.Bool("swap", false); !b {
		t.Errorf("swap = false")
	}
	if _, err := p.Int("scale", 0); err == nil {
		t.Errorf("Int(scale=0.1) did not fail")
	}
	n, err := p.Object("nested")
	if err != nil {
		t.Fatal(err)
	}
	if port, _ := n.Int("port", 0); port != 502 {
		t.Errorf("nested port = %d", port)
	}
	tls, _ := n.Object("tls")
	if b, _ := tls.Bool("insecure", false); !b {
		t.Errorf("nested tls.insecure not read: %v", n)
	}
	j, err := p.Object("json")
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := j.String("b", ""); s != "x" {
		t.Errorf("json object b = %q", s)
	}
	if d, _ := p.Duration("timeout", 0); d != 250*time.Millisecond {
		t.Errorf("timeout = %v", d)
	}
	if d, _ := p.Duration("ms", 0); d != 1500*time.Millisecond {
		t.Errorf("ms = %v", d)
	}
	if l, _ := p.Lookup("list"); len(l.([]any)) != 2 {
		t.Errorf("list = %v", l)
	}

	bad := &dmiv1beta1.CustomizedValue{Data: map[string]*anypb.Any{"x": {TypeUrl: "type.googleapis.com/v1beta1.Device"}}}
	if _, err := DecodeConfig(bad); err == nil {
		t.Errorf("a Device in configData was accepted")
	}
	// Round trip of our own packing.
	enc, err := EncodeConfig(map[string]any{"a": 1, "b": 2.5, "c": "s", "d": true, "e": map[string]any{"f": 1}})
	if err != nil {
		t.Fatal(err)
	}
	q, err := DecodeConfig(enc)
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := q.Int("a", 0); a != 1 {
		t.Errorf("a = %d", a)
	}
}

func TestRegisterCodec(t *testing.T) {
	codec := func(p Params) RegisterCodec {
		t.Helper()
		c, err := ParseRegisterCodec(p, DataUint16)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	h := func(s string) []byte {
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name string
		p    Params
		wire string
		want any
	}{
		{"uint16", Params{}, "ffff", int64(65535)},
		{"int16", Params{"dataType": "int16"}, "ffff", int64(-1)},
		{"int32", Params{"dataType": "int32"}, "fffffffe", int64(-2)},
		{"uint32 little words", Params{"dataType": "uint32", "wordOrder": "little"}, "00020001", int64(0x00010002)},
		{"float32", Params{"dataType": "float32"}, "41460000", 12.375},
		{"float32 little words", Params{"dataType": "float32", "wordOrder": "little"}, "00004146", 12.375},
		{"float32 KubeEdge isRegisterSwap", Params{"dataType": "float", "isRegisterSwap": true}, "00004146", 12.375},
		{"float32 little bytes", Params{"dataType": "float32", "byteOrder": "little"}, "46410000", 12.375},
		{"float64", Params{"dataType": "float64"}, "4029000000000000", 12.5},
		{"bool", Params{"dataType": "bool"}, "0001", true},
		{"bit mask", Params{"bitMask": "0x0f00"}, "0a55", int64(10)},
		{"bool bit", Params{"dataType": "bool", "bitMask": 4}, "0004", true},
		{"string", Params{"dataType": "string", "length": 3}, "414243440000", "ABCD"},
	}
	for _, tc := range cases {
		c := codec(tc.p)
		got, err := c.Decode(h(tc.wire))
		if err != nil || got != tc.want {
			t.Errorf("%s: Decode(%s) = %v (%T), %v; want %v", tc.name, tc.wire, got, got, err, tc.want)
			continue
		}
		var cur []byte
		if c.NeedsCurrent() {
			cur = h(tc.wire)
		}
		enc, err := c.Encode(got, cur)
		if err != nil || hex.EncodeToString(enc) != tc.wire {
			t.Errorf("%s: Encode(%v) = %x, %v; want %s", tc.name, got, enc, err, tc.wire)
		}
	}
	// A masked write keeps the other bits.
	c := codec(Params{"bitMask": 0x00f0})
	if enc, err := c.Encode(int64(3), h("ff0f")); err != nil || hex.EncodeToString(enc) != "ff3f" {
		t.Errorf("masked write = %x, %v; want ff3f", enc, err)
	}
	for _, tc := range []struct {
		p Params
		v any
	}{
		{Params{"dataType": "int16"}, 40000.0},
		{Params{"dataType": "uint16"}, -1.0},
		{Params{"dataType": "uint16"}, 1.5},
		{Params{"dataType": "string", "length": 1}, "abc"},
		{Params{"dataType": "float32"}, "x"},
	} {
		if _, err := codec(tc.p).Encode(tc.v, nil); err == nil {
			t.Errorf("Encode(%v) as %v did not fail", tc.v, tc.p)
		}
	}
	for _, p := range []Params{{"dataType": "int128"}, {"byteOrder": "middle"}, {"dataType": "float32", "bitMask": 1}, {"bitMask": -1}} {
		if _, err := ParseRegisterCodec(p, DataUint16); err == nil {
			t.Errorf("ParseRegisterCodec(%v) did not fail", p)
		}
	}
}

// TestValues: transforms and the deadband (the values' own edge cases are
// shared/twinvalue's table).
func TestValues(t *testing.T) {
	tr := Transform{Scale: 0.1, Offset: -40}
	v := tr.Apply(int64(650))
	if s, _ := twinvalue.Format(twinvalue.Double, v); s != "25" {
		t.Errorf("650*0.1-40 = %s", s)
	}
	// An integer scaled keeps the scale's decimals, not float64's noise;
	// a float read keeps its own.
	for raw, want := range map[any]string{int64(224): "22.4", uint64(3): "0.3", int64(-7): "-0.7", 0.123: "0.0123"} {
		if s, _ := twinvalue.Format(twinvalue.Double, Transform{Scale: 0.1}.Apply(raw)); s != want {
			t.Errorf("%v*0.1 = %s, want %s", raw, s, want)
		}
	}
	if s, _ := twinvalue.Format(twinvalue.Double, Transform{Scale: 0.01, Offset: 0.5}.Apply(int64(1001))); s != "10.51" {
		t.Errorf("1001*0.01+0.5 = %s, want 10.51", s)
	}
	if back := tr.Inverse(25.0).(float64); math.Abs(back-650) > 1e-9 {
		t.Errorf("inverse = %v", back)
	}
	if !changed(twinvalue.Double, "1.0", "1.6", 0.5) || changed(twinvalue.Double, "1.0", "1.4", 0.5) || !changed(twinvalue.String, "a", "b", 10) {
		t.Errorf("deadband comparison wrong")
	}
}
