package opcua

import (
	"context"
	"fmt"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/dowse-dev/dowse/mappers/mapper"
)

// Read reads one node's value.
func (d *Driver) Read(ctx context.Context, p *mapper.Property) (any, error) {
	r := d.ReadBatch(ctx, []*mapper.Property{p})
	return r[0].Value, r[0].Err
}

// ReadBatch reads every node in one Read request.
func (d *Driver) ReadBatch(ctx context.Context, ps []*mapper.Property) []mapper.Result {
	rs := make([]mapper.Result, len(ps))
	fail := func(err error) []mapper.Result {
		for i := range rs {
			rs[i].Err = err
		}
		return rs
	}
	if d.client == nil {
		return fail(fmt.Errorf("%w: not connected", mapper.ErrDisconnected))
	}
	req := &ua.ReadRequest{TimestampsToReturn: ua.TimestampsToReturnNeither}
	for _, p := range ps {
		req.NodesToRead = append(req.NodesToRead, &ua.ReadValueID{NodeID: p.Data.(*point).id, AttributeID: ua.AttributeIDValue})
	}
	resp, err := d.client.Read(ctx, req)
	if err != nil {
		return fail(d.classify(err, fmt.Sprintf("reading %d nodes", len(ps))))
	}
	if len(resp.Results) != len(ps) {
		return fail(fmt.Errorf("the server answered %d values for %d nodes", len(resp.Results), len(ps)))
	}
	for i, dv := range resp.Results {
		pt := ps[i].Data.(*point)
		rs[i].Value, rs[i].Err = d.value(pt, dv)
	}
	return rs
}

func (d *Driver) value(pt *point, dv *ua.DataValue) (any, error) {
	what := "reading " + pt.id.String()
	if dv == nil {
		return nil, fmt.Errorf("%s: no value", what)
	}
	if bad(dv.Status) {
		return nil, d.classify(dv.Status, what)
	}
	if dv.Value == nil {
		return nil, mapper.Permanentf("%s: the node has no value", what)
	}
	pt.typ = dv.Value.Type()
	return raw(dv.Value.Value())
}

// bad says whether a status code's severity is Bad (Good and Uncertain
// values are taken).
func bad(s ua.StatusCode) bool { return uint32(s)>>30 == 2 }

// raw turns an OPC UA value into one of the SDK's raw kinds.
func raw(v any) (any, error) {
	switch x := v.(type) {
	case bool:
		return x, nil
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case int64:
		return x, nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint64:
		return x, nil
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	case string:
		return x, nil
	case []byte:
		return x, nil
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano), nil
	case *ua.LocalizedText:
		return x.Text, nil
	case *ua.QualifiedName:
		return x.Name, nil
	case *ua.NodeID:
		return x.String(), nil
	case ua.StatusCode:
		return int64(x), nil
	case nil:
		return nil, mapper.Permanentf("the node has a null value")
	}
	return fmt.Sprint(v), nil
}
