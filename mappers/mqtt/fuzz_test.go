package mqtt

import (
	"testing"

	"github.com/dowse-dev/dowse/internal/sparkplug"
	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// FuzzPushes: whatever a broker delivers on a device's Sparkplug topics or
// a Home Assistant state topic becomes values of the properties' types or
// errors, never a panic that ends the mapper.
func FuzzPushes(f *testing.F) {
	sp, err := NewDriver(mapper.DeviceInfo{Protocol: mapper.Params{"broker": "tcp://b:1883", "source": "sparkplug", "group": "G", "edgeNode": "E", "device": "D"}})
	if err != nil {
		f.Fatal(err)
	}
	ha, err := NewDriver(mapper.DeviceInfo{Protocol: mapper.Params{"broker": "tcp://b:1883", "source": "homeassistant", "stateTopic": "s"}})
	if err != nil {
		f.Fatal(err)
	}
	var sps, has []*mapper.Property
	for _, typ := range []twinvalue.Type{twinvalue.Int, twinvalue.Float, twinvalue.Double, twinvalue.Boolean, twinvalue.String, twinvalue.Bytes} {
		p := &mapper.Property{Name: string(typ), Type: typ, Visitor: mapper.Params{"metric": "m" + string(typ)}}
		if err := sp.Prepare(p); err != nil {
			f.Fatal(err)
		}
		sps = append(sps, p)
		q := &mapper.Property{Name: string(typ), Type: typ, Visitor: mapper.Params{"field": "f"}}
		if typ == twinvalue.Boolean {
			q.Visitor = mapper.Params{}
		}
		if err := ha.Prepare(q); err != nil {
			f.Fatal(err)
		}
		has = append(has, q)
	}
	check := func(t *testing.T, p *mapper.Property, v any, err error) {
		if err != nil {
			return
		}
		switch v.(type) {
		case int64, uint64, float64, bool, string, []byte:
		default:
			t.Fatalf("%s: a raw value of Go type %T", p.Name, v)
		}
	}
	d := sp.(*Driver)
	d.ps = sps
	d.sink = func(p *mapper.Property, v any, err error) {}
	f.Add("spBv1.0/G/DBIRTH/E/D", sparkplug.Encode(&sparkplug.Payload{Metrics: []sparkplug.Metric{
		{Name: "mINT", HasName: true, Alias: 1, HasAlias: true, Datatype: sparkplug.Int16, Kind: sparkplug.IntValue, Uint: 0xFFFF}}}))
	f.Add("spBv1.0/G/DDATA/E/D", sparkplug.Encode(&sparkplug.Payload{Metrics: []sparkplug.Metric{{Alias: 1, HasAlias: true, Kind: sparkplug.DoubleValue, Float: 2}}}))
	f.Add("spBv1.0/G/DDEATH/E/D", []byte{})
	f.Add("spBv1.0/G/DDATA/E/D", sparkplug.Encode(&sparkplug.Payload{Metrics: []sparkplug.Metric{
		{Name: "mSTRING", HasName: true, Datatype: sparkplug.BooleanArray, Kind: sparkplug.BytesValue, Bytes: []byte{3, 0, 0, 0, 0xA0}},
		{Name: "mINT", HasName: true, Datatype: sparkplug.DataSet, Kind: sparkplug.DataSetKind, Bytes: sparkplug.EncodeDataSet(&sparkplug.Table{
			Columns: []string{"a"}, Types: []sparkplug.DataType{sparkplug.Int8}, Rows: [][]sparkplug.Cell{{{Kind: sparkplug.IntValue, Uint: 7}}}})}}}))
	f.Add("s", []byte(`{"f": 1.5}`))
	f.Add("s", []byte("ON"))
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		d.sink = func(p *mapper.Property, v any, err error) { check(t, p, v, err) }
		d.sparkplugMessage(topic, payload)
		for _, p := range has {
			v, err := haValue(p, payload)
			check(t, p, v, err)
		}
	})
}
