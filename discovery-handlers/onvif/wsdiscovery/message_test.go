package wsdiscovery

import (
	"encoding/xml"
	"slices"
	"strings"
	"testing"
)

// A camera's answer, in the shape ONVIF devices send (SOAP 1.2, prefixes of
// their own choosing, a default namespace for Types).
const cameraMatch = `<?xml version="1.0" encoding="UTF-8"?>
<env:Envelope xmlns:env="http://www.w3.org/2003/05/soap-envelope" xmlns:wsadis="http://schemas.xmlsoap.org/ws/2004/08/addressing" xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery" xmlns:dn="http://www.onvif.org/ver10/network/wsdl">
 <env:Header>
  <wsadis:MessageID>urn:uuid:0d9a6d0e-1111-2222-3333-444455556666</wsadis:MessageID>
  <wsadis:RelatesTo>urn:uuid:probe-1</wsadis:RelatesTo>
  <wsadis:To env:mustUnderstand="true">http://schemas.xmlsoap.org/ws/2004/08/addressing/role/anonymous</wsadis:To>
  <wsadis:Action env:mustUnderstand="true">http://schemas.xmlsoap.org/ws/2005/04/discovery/ProbeMatches</wsadis:Action>
 </env:Header>
 <env:Body>
  <d:ProbeMatches>
   <d:ProbeMatch>
    <wsadis:EndpointReference><wsadis:Address>urn:uuid:4d454930-3030-3030-3030-c056e3a1b2c3</wsadis:Address></wsadis:EndpointReference>
    <d:Types xmlns:tds="http://www.onvif.org/ver10/device/wsdl">dn:NetworkVideoTransmitter tds:Device</d:Types>
    <d:Scopes>onvif://www.onvif.org/type/video_encoder onvif://www.onvif.org/name/IPC onvif://www.onvif.org/location/country/china
    onvif://www.onvif.org/hardware/DS-2CD2043</d:Scopes>
    <d:XAddrs>http://192.168.1.64/onvif/device_service http://[fe80::c256:e3ff:fea1:b2c3]/onvif/device_service</d:XAddrs>
    <d:MetadataVersion>10</d:MetadataVersion>
   </d:ProbeMatch>
  </d:ProbeMatches>
 </env:Body>
</env:Envelope>`

// What wsdd sends when it starts.
const wsddHello = `<?xml version="1.0" encoding="utf-8"?>
<soap:Envelope xmlns:soap="http://www.w3.org/2003/05/soap-envelope" xmlns:wsa="http://schemas.xmlsoap.org/ws/2004/08/addressing" xmlns:wsd="http://schemas.xmlsoap.org/ws/2005/04/discovery" xmlns:wsdp="http://schemas.xmlsoap.org/ws/2006/02/devprof" xmlns:pub="http://schemas.microsoft.com/windows/pub/2005/07"><soap:Header><wsa:To>urn:schemas-xmlsoap-org:ws:2005:04:discovery</wsa:To><wsa:Action>http://schemas.xmlsoap.org/ws/2005/04/discovery/Hello</wsa:Action><wsa:MessageID>urn:uuid:9b0d</wsa:MessageID><wsd:AppSequence InstanceId="1" SequenceId="urn:uuid:x" MessageNumber="1" /></soap:Header><soap:Body><wsd:Hello><wsa:EndpointReference><wsa:Address>urn:uuid:e3c9a7b2-0000-4000-8000-000000000001</wsa:Address></wsa:EndpointReference><wsd:Types>wsdp:Device pub:Computer</wsd:Types><wsd:XAddrs>http://10.0.0.2:5357/e3c9a7b2-0000-4000-8000-000000000001</wsd:XAddrs><wsd:MetadataVersion>1</wsd:MetadataVersion></wsd:Hello></soap:Body></soap:Envelope>`

func TestParseProbeMatch(t *testing.T) {
	m, err := ParseMessage([]byte(cameraMatch))
	if err != nil {
		t.Fatal(err)
	}
	if m.Action != ActionProbeMatch || m.RelatesTo != "urn:uuid:probe-1" || len(m.Targets) != 1 {
		t.Fatalf("message %+v", m)
	}
	tg := m.Targets[0]
	if tg.Endpoint != "urn:uuid:4d454930-3030-3030-3030-c056e3a1b2c3" || tg.MetadataVersion != 10 {
		t.Errorf("target %+v", tg)
	}
	if !tg.HasType(TypeNetworkVideoTransmitter) || !tg.HasType(TypeONVIFDevice) || tg.HasType(TypeDevProfDevice) {
		t.Errorf("types %v", tg.Types)
	}
	if len(tg.Scopes) != 4 || tg.Scopes[3] != "onvif://www.onvif.org/hardware/DS-2CD2043" {
		t.Errorf("scopes %q", tg.Scopes)
	}
	if !slices.Equal(tg.XAddrs, []string{"http://192.168.1.64/onvif/device_service", "http://[fe80::c256:e3ff:fea1:b2c3]/onvif/device_service"}) {
		t.Errorf("xaddrs %q", tg.XAddrs)
	}
}

func TestParseHelloBye(t *testing.T) {
	m, err := ParseMessage([]byte(wsddHello))
	if err != nil {
		t.Fatal(err)
	}
	if m.Action != ActionHello || len(m.Targets) != 1 || !m.Targets[0].HasType(TypeDevProfDevice) || m.Targets[0].HasType(TypeNetworkVideoTransmitter) {
		t.Fatalf("hello %+v", m)
	}
	bye := strings.NewReplacer("/Hello<", "/Bye<", "wsd:Hello>", "wsd:Bye>").Replace(wsddHello)
	m, err = ParseMessage([]byte(bye))
	if err != nil || m.Action != ActionBye || m.Targets[0].Endpoint != "urn:uuid:e3c9a7b2-0000-4000-8000-000000000001" {
		t.Fatalf("bye %+v, %v", m, err)
	}
}

func TestParseGarbage(t *testing.T) {
	for name, msg := range map[string]string{
		"not XML":        "HTTP/1.1 200 OK",
		"truncated":      cameraMatch[:400],
		"not SOAP":       `<a/>`,
		"SOAP 1.1":       `<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Header/><s:Body/></s:Envelope>`,
		"no endpoint":    strings.Replace(cameraMatch, "<wsadis:Address>urn:uuid:4d454930-3030-3030-3030-c056e3a1b2c3</wsadis:Address>", "", 1),
		"undeclared":     strings.Replace(cameraMatch, "tds:Device", "xx:Device", 1),
		"bad version":    strings.Replace(cameraMatch, "<d:MetadataVersion>10", "<d:MetadataVersion>ten", 1),
		"hello, no body": strings.Replace(wsddHello, "wsd:Hello>", "wsd:Hullo>", 2),
		"deep":           `<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope">` + strings.Repeat("<x>", 40) + strings.Repeat("</x>", 40) + `</s:Envelope>`,
	} {
		if m, err := ParseMessage([]byte(msg)); err == nil {
			t.Errorf("%s: parsed as %+v", name, m)
		}
	}
}

func TestBuildProbe(t *testing.T) {
	p := BuildProbe("urn:uuid:1", TypeNetworkVideoTransmitter)
	if !strings.Contains(string(p), `<d:Types>dn:NetworkVideoTransmitter</d:Types>`) {
		t.Errorf("probe %s", p)
	}
	// wsdd compares the Types text literally.
	if p := BuildProbe("urn:uuid:1", TypeDevProfDevice); !strings.Contains(string(p), `<d:Types>wsdp:Device</d:Types>`) {
		t.Errorf("probe %s", p)
	}
	// A probe is well-formed and reads back with its types resolved.
	p = BuildProbe("urn:uuid:<&>", TypeONVIFDevice, xml.Name{Space: "urn:example:x", Local: "Cam"})
	root, err := parseTree(p)
	if err != nil {
		t.Fatalf("%v: %s", err, p)
	}
	types := root.child(NSSoap, "Body").child(NSDiscovery, "Probe").child(NSDiscovery, "Types")
	if types == nil || types.ns["tds"] != NSDevice || types.ns["t1"] != "urn:example:x" || types.text.String() != "tds:Device t1:Cam" {
		t.Errorf("probe %s", p)
	}
}
