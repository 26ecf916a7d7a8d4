package snmp

import (
	"testing"
	"unicode/utf8"

	"github.com/gosnmp/gosnmp"

	"github.com/dowse-dev/dowse/internal/snmpclient"
	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// FuzzResponses: whatever bytes come back to a GET, decoding them (gosnmp)
// and reading each property from them gives a value of the property's
// type (bounded, valid UTF-8 text) or an error, never a panic that ends
// the mapper.
func FuzzResponses(f *testing.F) {
	props := []*mapper.Property{
		{Name: "upTime", Type: twinvalue.Int, Visitor: mapper.Params{"oid": ".1.3.6.1.2.1.1.3.0", "type": "timeTicks"}},
		{Name: "name", Type: twinvalue.String, Visitor: mapper.Params{"oid": ".1.3.6.1.2.1.1.5.0"}},
		{Name: "on", Type: twinvalue.Boolean, Visitor: mapper.Params{"oid": ".1.3.6.1.2.1.1.7.0"}},
		{Name: "raw", Type: twinvalue.Bytes, Visitor: mapper.Params{"oid": ".1.3.6.1.2.1.1.1.0"}},
		{Name: "octets", Type: twinvalue.Double, Visitor: mapper.Params{"oid": ".1.3.6.1.2.1.31.1.1.1.6.1", "type": "counter64"}},
		{Name: "id", Type: twinvalue.String, Visitor: mapper.Params{"oid": ".1.3.6.1.2.1.1.2.0", "type": "objectIdentifier"}},
	}
	d := &Driver{}
	for _, p := range props {
		if err := d.Prepare(p); err != nil {
			f.Fatalf("Prepare %s: %v", p.Name, err)
		}
	}
	pkt := &gosnmp.SnmpPacket{Version: gosnmp.Version2c, Community: "public", PDUType: gosnmp.GetResponse, RequestID: 9, Variables: []gosnmp.SnmpPDU{
		{Name: ".1.3.6.1.2.1.1.3.0", Type: gosnmp.TimeTicks, Value: uint32(4711)},
		{Name: ".1.3.6.1.2.1.1.5.0", Type: gosnmp.OctetString, Value: []byte("pump-7")},
		{Name: ".1.3.6.1.2.1.1.7.0", Type: gosnmp.Integer, Value: 1},
		{Name: ".1.3.6.1.2.1.1.1.0", Type: gosnmp.OctetString, Value: []byte{0, 1, 0xff}},
		{Name: ".1.3.6.1.2.1.31.1.1.1.6.1", Type: gosnmp.Counter64, Value: uint64(1 << 40)},
		{Name: ".1.3.6.1.2.1.1.2.0", Type: gosnmp.ObjectIdentifier, Value: ".1.3.6.1.4.1.8072.3.2.10"},
	}}
	b, err := pkt.MarshalMsg()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	pkt.Variables[2] = gosnmp.SnmpPDU{Name: ".1.3.6.1.2.1.1.7.0", Type: gosnmp.NoSuchInstance}
	if b, err = pkt.MarshalMsg(); err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte("\x30\x03\x02\x01\x01HTTP/1.1 400 Bad Request\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var vars []gosnmp.SnmpPDU
		if err := snmpclient.Do(func() error {
			pkt, err := (&gosnmp.GoSNMP{Version: gosnmp.Version2c}).SnmpDecodePacket(b)
			if err == nil {
				vars = pkt.Variables
			}
			return err
		}); err != nil {
			return
		}
		for i, v := range vars {
			p := props[i%len(props)]
			got, err := decode(p, v)
			if err != nil {
				continue
			}
			switch x := got.(type) {
			case string:
				if len(x) > snmpclient.MaxText || !utf8.ValidString(x) {
					t.Fatalf("%s: text %q unbounded or not UTF-8", p.Name, x)
				}
			case []byte:
				if p.Type != twinvalue.Bytes {
					t.Fatalf("%s: bytes for a %s", p.Name, p.Type)
				}
			case bool:
				if p.Type != twinvalue.Boolean {
					t.Fatalf("%s: a bool for a %s", p.Name, p.Type)
				}
			case int64, uint64:
				if !p.Type.Numeric() {
					t.Fatalf("%s: a number for a %s", p.Name, p.Type)
				}
			default:
				t.Fatalf("%s: %v (%T) is no raw value", p.Name, got, got)
			}
		}
	})
}
