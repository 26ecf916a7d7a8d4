package wsdiscovery

import (
	"encoding/xml"
	"testing"
)

// FuzzParseMessage: whatever a host on the LAN sends to the discovery port
// is parsed without a panic, and what parses keeps its promise: targets
// only for the four actions that carry them. The seeds are a probe of our own, and the replies of real peers
// the tests meet (wsdd, go2rtc).
func FuzzParseMessage(f *testing.F) {
	f.Add(BuildProbe("urn:uuid:1", xml.Name{Space: "http://www.onvif.org/ver10/network/wsdl", Local: "NetworkVideoTransmitter"}))
	f.Add(BuildResolve("urn:uuid:2", "urn:uuid:device"))
	f.Add([]byte(`<?xml version="1.0"?><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:a="http://schemas.xmlsoap.org/ws/2004/08/addressing" xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery" xmlns:dn="http://www.onvif.org/ver10/network/wsdl"><s:Header><a:Action>http://schemas.xmlsoap.org/ws/2005/04/discovery/ProbeMatches</a:Action><a:MessageID>urn:uuid:3</a:MessageID><a:RelatesTo>urn:uuid:1</a:RelatesTo></s:Header><s:Body><d:ProbeMatches><d:ProbeMatch><a:EndpointReference><a:Address>urn:uuid:cam</a:Address></a:EndpointReference><d:Types>dn:NetworkVideoTransmitter</d:Types><d:Scopes>onvif://www.onvif.org/name/cam</d:Scopes><d:XAddrs>http://127.0.0.1:1984/onvif/device_service</d:XAddrs><d:MetadataVersion>1</d:MetadataVersion></d:ProbeMatch></d:ProbeMatches></s:Body></s:Envelope>`))
	f.Add([]byte(`<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:a="http://schemas.xmlsoap.org/ws/2004/08/addressing" xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery"><s:Header><a:Action>http://schemas.xmlsoap.org/ws/2005/04/discovery/Bye</a:Action></s:Header><s:Body><d:Bye><a:EndpointReference><a:Address>urn:uuid:x</a:Address></a:EndpointReference></d:Bye></s:Body></s:Envelope>`))
	f.Add([]byte(`<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Header/><s:Body/></s:Envelope>`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMessage(data)
		if err != nil {
			if m != nil {
				t.Fatalf("a message with the error %v", err)
			}
			return
		}
		switch m.Action {
		case ActionProbeMatch, ActionResolveMatch, ActionHello, ActionBye:
		default:
			if len(m.Targets) != 0 {
				t.Fatalf("action %q with targets %+v", m.Action, m.Targets)
			}
		}
	})
}
