// Package wsdiscovery is the client side of WS-Discovery (the 2005/04
// version ONVIF uses): it builds Probe messages, parses ProbeMatches, Hello
// and Bye, and sends probes and listens for announcements on the multicast
// group 239.255.255.250:3702 of chosen interfaces.
package wsdiscovery

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Namespaces and actions.
const (
	NSSoap       = "http://www.w3.org/2003/05/soap-envelope"
	NSAddressing = "http://schemas.xmlsoap.org/ws/2004/08/addressing"
	NSDiscovery  = "http://schemas.xmlsoap.org/ws/2005/04/discovery"
	// NSNetwork holds ONVIF's NetworkVideoTransmitter type.
	NSNetwork = "http://www.onvif.org/ver10/network/wsdl"
	// NSDevice holds ONVIF's Device type.
	NSDevice = "http://www.onvif.org/ver10/device/wsdl"
	// NSDevProf holds the Devices Profile's Device type (what wsdd answers).
	NSDevProf = "http://schemas.xmlsoap.org/ws/2006/02/devprof"

	ActionProbe        = NSDiscovery + "/Probe"
	ActionProbeMatch   = NSDiscovery + "/ProbeMatches"
	ActionHello        = NSDiscovery + "/Hello"
	ActionBye          = NSDiscovery + "/Bye"
	ActionResolve      = NSDiscovery + "/Resolve"
	ActionResolveMatch = NSDiscovery + "/ResolveMatches"

	// ToDiscovery is the To of multicast discovery messages.
	ToDiscovery = "urn:schemas-xmlsoap-org:ws:2005:04:discovery"
)

// Well-known types.
var (
	TypeNetworkVideoTransmitter = xml.Name{Space: NSNetwork, Local: "NetworkVideoTransmitter"}
	TypeONVIFDevice             = xml.Name{Space: NSDevice, Local: "Device"}
	TypeDevProfDevice           = xml.Name{Space: NSDevProf, Local: "Device"}
)

// prefixes are the prefixes probes use for known namespaces. Some peers
// compare the Types text literally (wsdd wants "wsdp:Device"), so the
// conventional prefixes are used.
var prefixes = map[string]string{NSNetwork: "dn", NSDevice: "tds", NSDevProf: "wsdp"}

// KnownPrefixes maps the conventional prefixes to their namespaces, for
// reading types such as "dn:NetworkVideoTransmitter" from configuration.
var KnownPrefixes = map[string]string{"dn": NSNetwork, "tds": NSDevice, "wsdp": NSDevProf}

// BuildProbe returns a Probe for devices of all the given types (one type
// is usual: a device must have every type listed to match).
func BuildProbe(messageID string, types ...xml.Name) []byte {
	var b bytes.Buffer
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>` +
		`<s:Envelope xmlns:s="` + NSSoap + `" xmlns:a="` + NSAddressing + `" xmlns:d="` + NSDiscovery + `"`)
	var qnames []string
	declared := map[string]string{}
	for i, t := range types {
		p, ok := prefixes[t.Space]
		if !ok {
			p = "t" + strconv.Itoa(i)
		}
		if _, done := declared[p]; !done {
			declared[p] = t.Space
			b.WriteString(` xmlns:` + p + `="`)
			xml.EscapeText(&b, []byte(t.Space))
			b.WriteString(`"`)
		}
		qnames = append(qnames, p+":"+t.Local)
	}
	b.WriteString(`><s:Header><a:Action s:mustUnderstand="1">` + ActionProbe + `</a:Action><a:MessageID>`)
	xml.EscapeText(&b, []byte(messageID))
	b.WriteString(`</a:MessageID><a:To s:mustUnderstand="1">` + ToDiscovery + `</a:To></s:Header><s:Body><d:Probe>`)
	if len(qnames) > 0 {
		b.WriteString(`<d:Types>` + strings.Join(qnames, " ") + `</d:Types>`)
	}
	b.WriteString(`</d:Probe></s:Body></s:Envelope>`)
	return b.Bytes()
}

// BuildResolve returns a Resolve for the endpoint: a device that answered a
// probe without its XAddrs answers it with them.
func BuildResolve(messageID, endpoint string) []byte {
	var b bytes.Buffer
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>` +
		`<s:Envelope xmlns:s="` + NSSoap + `" xmlns:a="` + NSAddressing + `" xmlns:d="` + NSDiscovery + `">` +
		`<s:Header><a:Action s:mustUnderstand="1">` + ActionResolve + `</a:Action><a:MessageID>`)
	xml.EscapeText(&b, []byte(messageID))
	b.WriteString(`</a:MessageID><a:To s:mustUnderstand="1">` + ToDiscovery + `</a:To></s:Header><s:Body><d:Resolve><a:EndpointReference><a:Address>`)
	xml.EscapeText(&b, []byte(endpoint))
	b.WriteString(`</a:Address></a:EndpointReference></d:Resolve></s:Body></s:Envelope>`)
	return b.Bytes()
}

// Message is a parsed discovery message.
type Message struct {
	Action    string
	MessageID string
	RelatesTo string
	// Targets are the ProbeMatch entries of a ProbeMatches, or the one
	// target of a Hello or Bye.
	Targets []Target
}

// Target is one device as a discovery message describes it (ProbeMatch,
// ResolveMatch, Hello or Bye).
type Target struct {
	// Endpoint is the endpoint reference address, usually urn:uuid:...
	Endpoint        string
	Types           []xml.Name
	Scopes          []string
	XAddrs          []string
	MetadataVersion uint64
}

// HasType reports whether the target lists t.
func (t Target) HasType(want xml.Name) bool {
	for _, have := range t.Types {
		if have == want {
			return true
		}
	}
	return false
}

// node is a parsed XML element with the namespace prefixes in scope, needed
// to resolve the QNames inside Types.
type node struct {
	name     xml.Name
	text     strings.Builder
	children []*node
	ns       map[string]string
}

func (n *node) child(space, local string) *node {
	for _, c := range n.children {
		if c.name.Space == space && c.name.Local == local {
			return c
		}
	}
	return nil
}

func (n *node) childText(space, local string) string {
	if c := n.child(space, local); c != nil {
		return strings.TrimSpace(c.text.String())
	}
	return ""
}

// maxDepth bounds nesting, so that a hostile datagram cannot make the
// parser work hard.
const maxDepth = 32

func parseTree(data []byte) (*node, error) {
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.Strict = true
	var stack []*node
	var root *node
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if len(stack) >= maxDepth {
				return nil, errors.New("too deeply nested")
			}
			n := &node{name: t.Name, ns: map[string]string{}}
			if len(stack) > 0 {
				parent := stack[len(stack)-1]
				for k, v := range parent.ns {
					n.ns[k] = v
				}
				parent.children = append(parent.children, n)
			} else {
				root = n
			}
			for _, a := range t.Attr {
				switch {
				case a.Name.Space == "xmlns":
					n.ns[a.Name.Local] = a.Value
				case a.Name.Space == "" && a.Name.Local == "xmlns":
					n.ns[""] = a.Value
				}
			}
			stack = append(stack, n)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				stack[len(stack)-1].text.Write(t)
			}
		}
	}
	if root == nil {
		return nil, errors.New("no XML element")
	}
	return root, nil
}

// ParseMessage parses a SOAP envelope carrying ProbeMatches,
// ResolveMatches, Hello or Bye.
// Other actions are returned with no targets.
func ParseMessage(data []byte) (*Message, error) {
	root, err := parseTree(data)
	if err != nil {
		return nil, fmt.Errorf("not XML: %w", err)
	}
	if root.name != (xml.Name{Space: NSSoap, Local: "Envelope"}) {
		return nil, fmt.Errorf("not a SOAP 1.2 envelope: %s %s", root.name.Space, root.name.Local)
	}
	header, body := root.child(NSSoap, "Header"), root.child(NSSoap, "Body")
	if header == nil || body == nil {
		return nil, errors.New("envelope without Header or Body")
	}
	m := &Message{
		Action:    header.childText(NSAddressing, "Action"),
		MessageID: header.childText(NSAddressing, "MessageID"),
		RelatesTo: header.childText(NSAddressing, "RelatesTo"),
	}
	var entries []*node
	switch m.Action {
	case ActionProbeMatch:
		if pm := body.child(NSDiscovery, "ProbeMatches"); pm != nil {
			for _, c := range pm.children {
				if c.name == (xml.Name{Space: NSDiscovery, Local: "ProbeMatch"}) {
					entries = append(entries, c)
				}
			}
		}
	case ActionResolveMatch:
		rm := body.child(NSDiscovery, "ResolveMatches")
		if rm == nil {
			return nil, errors.New("ResolveMatches without its body element")
		}
		entries = append(entries, rm.child(NSDiscovery, "ResolveMatch"))
	case ActionHello:
		entries = append(entries, body.child(NSDiscovery, "Hello"))
	case ActionBye:
		entries = append(entries, body.child(NSDiscovery, "Bye"))
	default:
		return m, nil
	}
	for _, e := range entries {
		if e == nil {
			return nil, fmt.Errorf("%s without its body element", m.Action)
		}
		t, err := parseTarget(e)
		if err != nil {
			return nil, err
		}
		m.Targets = append(m.Targets, t)
	}
	return m, nil
}

func parseTarget(e *node) (Target, error) {
	var t Target
	if epr := e.child(NSAddressing, "EndpointReference"); epr != nil {
		t.Endpoint = epr.childText(NSAddressing, "Address")
	}
	if t.Endpoint == "" {
		return t, errors.New("target without an endpoint reference address")
	}
	if types := e.child(NSDiscovery, "Types"); types != nil {
		for _, q := range strings.Fields(types.text.String()) {
			prefix, local, ok := strings.Cut(q, ":")
			if !ok {
				prefix, local = "", q
			}
			space, known := types.ns[prefix]
			if !known {
				return t, fmt.Errorf("type %q: prefix %q is not declared", q, prefix)
			}
			t.Types = append(t.Types, xml.Name{Space: space, Local: local})
		}
	}
	t.Scopes = strings.Fields(e.childText(NSDiscovery, "Scopes"))
	t.XAddrs = strings.Fields(e.childText(NSDiscovery, "XAddrs"))
	if v := e.childText(NSDiscovery, "MetadataVersion"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return t, fmt.Errorf("metadata version %q: %w", v, err)
		}
		t.MetadataVersion = n
	}
	return t, nil
}
