package modbus

import (
	"testing"

	"github.com/goburrow/modbus"
)

// FuzzDeviceIdentification: a Read Device Identification answer of any
// bytes is read or refused with an error, never a panic, and yields no
// more objects than it says it holds, none longer than a length byte.
func FuzzDeviceIdentification(f *testing.F) {
	f.Add(byte(fcReadDeviceIdentification), []byte{meiReadDeviceIdentification, 2, 0x82, 0, 0, 2, 0, 4, 'A', 'c', 'm', 'e', 1, 2, 'P', '1'})
	f.Add(byte(fcReadDeviceIdentification), []byte{meiReadDeviceIdentification, 1, 0x81, 0xff, 3, 1, 0, 0})
	f.Add(byte(fcReadDeviceIdentification|0x80), []byte{2})
	f.Add(byte(fcReadDeviceIdentification), []byte{meiReadDeviceIdentification, 1, 1, 0, 0, 9, 0, 200})
	f.Fuzz(func(t *testing.T, fc byte, data []byte) {
		objects := map[byte]string{}
		_, _, _, err := parseDeviceIdentification(&modbus.ProtocolDataUnit{FunctionCode: fc, Data: data}, objects)
		if err != nil {
			return
		}
		if len(data) < 6 || len(objects) > int(data[5]) {
			t.Fatalf("answer % x read as %d objects", data, len(objects))
		}
		for id, v := range objects {
			if len(v) > 255 {
				t.Fatalf("object %d of %d bytes", id, len(v))
			}
		}
	})
}
