package mapper

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// FuzzPayload: the JSON a pushMethod sink sends is valid JSON (RFC 8259:
// UTF-8, escaped controls) for any names and value a Device and a device
// can give, and reads back as them (each byte that is not UTF-8 as
// U+FFFD, as encoding/json writes it).
func FuzzPayload(f *testing.F) {
	f.Add("default", "boiler-1", "temperature", "21.5", int64(1764641234567))
	f.Add("ns", "d", "a\x7f\x01\"\\", "caf\xc3\xa9 \xff\u2028", int64(-1))
	f.Fuzz(func(t *testing.T, ns, device, property, value string, ms int64) {
		b := payload(ns, device, property, value, twinvalue.String, time.UnixMilli(ms))
		if !json.Valid(b) || !utf8.Valid(b) {
			t.Fatalf("payload %q is not valid JSON in UTF-8", b)
		}
		var got struct {
			Namespace, Device, Property, Value, Type string
			Timestamp                                int64
		}
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		if err := d.Decode(&got); err != nil {
			t.Fatalf("payload %q: %v", b, err)
		}
		valid := func(s string) string { // each byte that is not UTF-8 as U+FFFD
			var b strings.Builder
			for _, r := range s {
				b.WriteRune(r)
			}
			return b.String()
		}
		if got.Namespace != valid(ns) || got.Device != valid(device) || got.Property != valid(property) || got.Value != valid(value) ||
			got.Type != string(twinvalue.String) || got.Timestamp != ms {
			t.Fatalf("payload %q read back as %+v", b, got)
		}
	})
}
