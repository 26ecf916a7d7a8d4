package opcua

import (
	"testing"

	"github.com/gopcua/opcua/ua"

	"github.com/dowse-dev/dowse/mappers/mapper"
)

func TestParseDevice(t *testing.T) {
	c, err := parseDevice(mapper.Params{"endpoint": "opc.tcp://10.0.0.1:4840", "securityPolicy": "Basic256Sha256", "securityMode": "Sign", "timeout": 2000.0})
	if err != nil || c.mode != ua.MessageSecurityModeSign || c.policy != "Basic256Sha256" || c.timeout.Seconds() != 2 {
		t.Errorf("parseDevice = %+v, %v", c, err)
	}
	for _, p := range []mapper.Params{
		{},
		{"endpoint": "http://x:1"},
		{"endpoint": "opc.tcp://x:1", "securityMode": "Sign"}, // with policy None
		{"endpoint": "opc.tcp://x:1", "securityPolicy": "Basic999"},
		{"endpoint": "opc.tcp://x:1", "certificate": "not pem", "privateKey": "not pem"},
		{"endpoint": "opc.tcp://x:1", "certificate": "x"},
	} {
		if _, err := parseDevice(p); err == nil {
			t.Errorf("parseDevice(%v) did not fail", p)
		}
	}
}

func TestAsType(t *testing.T) {
	for _, tc := range []struct {
		t    ua.TypeID
		v    any
		want any
	}{
		{ua.TypeIDInt32, 42.0, int32(42)}, {ua.TypeIDInt16, int64(-3), int16(-3)}, {ua.TypeIDFloat, 2.5, float32(2.5)},
		{ua.TypeIDBoolean, true, true}, {ua.TypeIDString, "x", "x"}, {ua.TypeIDUint64, uint64(7), uint64(7)},
	} {
		if got, err := asType(tc.t, tc.v); err != nil || got != tc.want {
			t.Errorf("asType(%v, %v) = %v (%T), %v", tc.t, tc.v, got, got, err)
		}
	}
	for _, tc := range []struct {
		t ua.TypeID
		v any
	}{{ua.TypeIDByte, 300.0}, {ua.TypeIDInt32, 1.5}, {ua.TypeIDInt32, "x"}, {ua.TypeIDGUID, "x"}} {
		if _, err := asType(tc.t, tc.v); err == nil {
			t.Errorf("asType(%v, %v) did not fail", tc.t, tc.v)
		}
	}
	if err := (&Driver{}).Prepare(&mapper.Property{Visitor: mapper.Params{"nodeId": "ns=x;q=1"}}); err == nil {
		t.Errorf("a bad node id was accepted")
	}
}
