package opcua

import (
	"context"
	"fmt"
	"math"

	"github.com/gopcua/opcua/ua"

	"github.com/dowse-dev/dowse/mappers/mapper"
)

// Write writes a value as the node's own type (learned from a read).
func (d *Driver) Write(ctx context.Context, p *mapper.Property, v any) error {
	pt := p.Data.(*point)
	if d.client == nil {
		return fmt.Errorf("%w: not connected", mapper.ErrDisconnected)
	}
	what := "writing " + pt.id.String()
	if pt.typ == 0 {
		if _, err := d.Read(ctx, p); err != nil {
			return err
		}
	}
	val, err := asType(pt.typ, v)
	if err != nil {
		return mapper.Permanentf("%s: %v", what, err)
	}
	variant, err := ua.NewVariant(val)
	if err != nil {
		return mapper.Permanentf("%s: %v", what, err)
	}
	resp, err := d.client.Write(ctx, &ua.WriteRequest{NodesToWrite: []*ua.WriteValue{{
		NodeID: pt.id, AttributeID: ua.AttributeIDValue,
		Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: variant},
	}}})
	if err != nil {
		return d.classify(err, what)
	}
	if len(resp.Results) != 1 {
		return fmt.Errorf("%s: %d results", what, len(resp.Results))
	}
	if s := resp.Results[0]; bad(s) {
		return d.classify(s, what)
	}
	return nil
}

// asType converts a raw value to the Go type of an OPC UA built-in type.
func asType(t ua.TypeID, v any) (any, error) {
	num := func() (float64, error) {
		switch x := v.(type) {
		case int64:
			return float64(x), nil
		case uint64:
			return float64(x), nil
		case float64:
			return x, nil
		case bool:
			if x {
				return 1, nil
			}
			return 0, nil
		}
		return 0, fmt.Errorf("%v (%T) is not a number", v, v)
	}
	integer := func(lo, hi float64) (float64, error) {
		f, err := num()
		if err != nil {
			return 0, err
		}
		r := math.Round(f)
		if math.Abs(f-r) > 1e-9 {
			return 0, fmt.Errorf("%v is not an integer", f)
		}
		if r < lo || r > hi {
			return 0, fmt.Errorf("%v does not fit the node's %s", r, t)
		}
		return r, nil
	}
	switch t {
	case ua.TypeIDBoolean:
		switch x := v.(type) {
		case bool:
			return x, nil
		case string:
			return x == "true", nil
		}
		f, err := num()
		return f != 0, err
	case ua.TypeIDSByte:
		f, err := integer(math.MinInt8, math.MaxInt8)
		return int8(f), err
	case ua.TypeIDByte:
		f, err := integer(0, math.MaxUint8)
		return uint8(f), err
	case ua.TypeIDInt16:
		f, err := integer(math.MinInt16, math.MaxInt16)
		return int16(f), err
	case ua.TypeIDUint16:
		f, err := integer(0, math.MaxUint16)
		return uint16(f), err
	case ua.TypeIDInt32:
		f, err := integer(math.MinInt32, math.MaxInt32)
		return int32(f), err
	case ua.TypeIDUint32:
		f, err := integer(0, math.MaxUint32)
		return uint32(f), err
	case ua.TypeIDInt64:
		if x, ok := v.(int64); ok {
			return x, nil
		}
		f, err := integer(math.MinInt64, math.MaxInt64)
		return int64(f), err
	case ua.TypeIDUint64:
		if x, ok := v.(uint64); ok {
			return x, nil
		}
		f, err := integer(0, math.MaxUint64)
		return uint64(f), err
	case ua.TypeIDFloat:
		f, err := num()
		if err == nil && math.Abs(f) > math.MaxFloat32 {
			err = fmt.Errorf("%v does not fit a Float", f)
		}
		return float32(f), err
	case ua.TypeIDDouble:
		return num()
	case ua.TypeIDString:
		switch x := v.(type) {
		case string:
			return x, nil
		case []byte:
			return string(x), nil
		}
		return fmt.Sprint(v), nil
	case ua.TypeIDByteString:
		switch x := v.(type) {
		case []byte:
			return x, nil
		case string:
			return []byte(x), nil
		}
	}
	return nil, fmt.Errorf("writing a node of type %s is not supported", t)
}
