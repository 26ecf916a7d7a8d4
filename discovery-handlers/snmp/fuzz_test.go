package snmp

import (
	"testing"
	"unicode/utf8"

	"github.com/gosnmp/gosnmp"

	"github.com/dowse-dev/dowse/internal/snmpclient"
)

// FuzzAnswer: whatever bytes come back to a probe, decoding them (gosnmp)
// and reading the system group from them gives an agent's bounded,
// printable values or an error, never a panic that ends the handler.
func FuzzAnswer(f *testing.F) {
	f.Add(answerBytes(f, false))
	f.Add(answerBytes(f, true))
	f.Add([]byte{0x30, 0x82, 0x7f, 0xff, 0x02, 0x01})
	f.Add([]byte("HTTP/1.1 400 Bad Request\r\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var a agentInfo
		err := snmpclient.Do(func() error {
			g := &gosnmp.GoSNMP{Version: gosnmp.Version2c, Community: "public"}
			pkt, err := g.SnmpDecodePacket(b)
			if err != nil {
				return err
			}
			a, err = readAnswer(pkt)
			return err
		})
		if err != nil {
			return
		}
		for _, v := range []string{a.descr, a.objectID, a.name} {
			if len(v) > snmpclient.MaxText*2 || !utf8.ValidString(v) {
				t.Fatalf("value %q: unbounded or not UTF-8", v)
			}
		}
		if len(a.descr) > snmpclient.MaxText || len(a.name) > snmpclient.MaxText {
			t.Fatalf("text over %d bytes: %q %q", snmpclient.MaxText, a.descr, a.name)
		}
		if _, err := snmpclient.NormalizeOID(a.objectID); err != nil {
			t.Fatalf("sysObjectID %q: %v", a.objectID, err)
		}
	})
}

// answerBytes is a v2c response to the probe, as an agent sends it
// (without sysName when noName).
func answerBytes(t testing.TB, noName bool) []byte {
	t.Helper()
	pkt := &gosnmp.SnmpPacket{Version: gosnmp.Version2c, Community: "public", PDUType: gosnmp.GetResponse, RequestID: 7, Variables: []gosnmp.SnmpPDU{
		{Name: oidSysDescr, Type: gosnmp.OctetString, Value: []byte("Linux pump-7")},
		{Name: oidSysObjectID, Type: gosnmp.ObjectIdentifier, Value: ".1.3.6.1.4.1.8072.3.2.10"},
		{Name: oidSysName, Type: gosnmp.OctetString, Value: []byte("pump-7")},
	}}
	if noName {
		pkt.Variables[2] = gosnmp.SnmpPDU{Name: oidSysName, Type: gosnmp.NoSuchObject}
	}
	b, err := pkt.MarshalMsg()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
