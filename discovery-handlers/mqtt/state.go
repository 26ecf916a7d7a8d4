package mqtt

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/dowse-dev/dowse/internal/sparkplug"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// Reasons a candidate is skipped (handler.SetSkipped).
const (
	// SkipGarbage: a payload that is not what its topic says (not a
	// Sparkplug B payload, not a JSON object), or larger than maxPayload.
	SkipGarbage = "Garbage"
	// SkipNoMatch: a device that fails the details' filters.
	SkipNoMatch = "NoMatch"
	// SkipOverLimit: a device past maxDevices, not kept.
	SkipOverLimit = "OverLimit"
	// SkipConnectFailed: the broker cannot be reached or refused the
	// connection (credentials, TLS); the candidate is the broker.
	SkipConnectFailed = "ConnectFailed"
)

// maxGarbage bounds the topics remembered as garbage.
const maxGarbage = 64

// node is what is known of a Sparkplug edge node.
type node struct {
	born     bool // its NBIRTH was seen (it is listed, unless filtered)
	bdSeq    uint64
	hasBdSeq bool
	devices  map[string]bool // device ids with a device listed or filtered
}

// state is one stream's table of devices, fed by the messages received.
// It is not safe for concurrent use: the stream's loop owns it.
type state struct {
	d      *Details
	broker string
	// devices are listed, filtered are held back by the filters (with
	// why), both keyed by device id; both count towards maxDevices.
	devices  map[string]*discoveryv1.Device
	filtered map[string]string
	overflow map[string]bool
	nodes    map[string]*node // by spBv1.0/<group>/<edge node>
	garbage  map[string]string
	connErr  string
	// rebirth is set to the edge node's NCMD topic when a rebirth should be
	// requested (requestRebirth); the loop publishes it and clears it.
	rebirth []string
	asked   map[string]bool
	// haDevices are the device ids of each device-based Home Assistant
	// config's components, by its topic without /config (at most
	// maxDevices configs).
	haDevices map[string][]string
}

func newState(d *Details) *state {
	return &state{d: d, broker: d.Broker, devices: map[string]*discoveryv1.Device{}, filtered: map[string]string{},
		overflow: map[string]bool{}, nodes: map[string]*node{}, garbage: map[string]string{}, asked: map[string]bool{},
		haDevices: map[string][]string{}}
}

// handle applies one message and says whether the list may have changed.
func (s *state) handle(topic string, payload []byte) bool {
	if strings.HasPrefix(topic, sparkplug.Namespace+"/") {
		if s.d.Sparkplug == nil {
			return false
		}
		return s.sparkplug(topic, payload)
	}
	if ha := s.d.HomeAssistant; ha != nil && strings.HasPrefix(topic, ha.Prefix+"/") {
		return s.homeAssistant(topic, payload)
	}
	return false
}

func (s *state) noteGarbage(topic, why string) bool {
	if _, ok := s.garbage[topic]; !ok && len(s.garbage) >= maxGarbage {
		return false
	}
	s.garbage[topic] = why
	return true
}

func (s *state) clearGarbage(topic string) bool {
	if _, ok := s.garbage[topic]; ok {
		delete(s.garbage, topic)
		return true
	}
	return false
}

// put lists dev (or holds it back as filtered when why is not empty),
// within maxDevices.
func (s *state) put(id string, dev *discoveryv1.Device, why string) {
	_, listed := s.devices[id]
	_, held := s.filtered[id]
	if !listed && !held && len(s.devices)+len(s.filtered) >= s.d.MaxDevices {
		if len(s.overflow) < s.d.MaxDevices {
			s.overflow[id] = true
		}
		return
	}
	delete(s.overflow, id)
	if why != "" {
		delete(s.devices, id)
		s.filtered[id] = why
		return
	}
	delete(s.filtered, id)
	s.devices[id] = dev
}

func (s *state) remove(id string) bool {
	_, listed := s.devices[id]
	_, held := s.filtered[id]
	over := s.overflow[id]
	delete(s.devices, id)
	delete(s.filtered, id)
	delete(s.overflow, id)
	return listed || held || over
}

func (s *state) sparkplug(topic string, payload []byte) bool {
	t, ok := sparkplug.ParseTopic(topic)
	if !ok {
		return false // STATE, commands, other shapes: not ours to judge
	}
	sp := s.d.Sparkplug
	if len(sp.Groups) > 0 && !slices.Contains(sp.Groups, t.Group) {
		return false
	}
	nodeID := sparkplug.Namespace + "/" + t.Group + "/" + t.EdgeNode
	var p *sparkplug.Payload
	if len(payload) > s.d.MaxPayload {
		return s.noteGarbage(topic, fmt.Sprintf("a %d-byte payload, more than maxPayload (%d)", len(payload), s.d.MaxPayload))
	}
	if t.Type == sparkplug.NBIRTH || t.Type == sparkplug.DBIRTH || t.Type == sparkplug.NDEATH {
		var err error
		if p, err = sparkplug.Decode(payload, s.d.MaxMetrics); err != nil {
			if t.Type != sparkplug.NDEATH {
				return s.noteGarbage(topic, err.Error())
			}
			p = nil // a death is a death whatever its payload says
		}
	}
	changed := s.clearGarbage(topic)
	n := s.nodes[nodeID]
	switch t.Type {
	case sparkplug.NBIRTH:
		if n == nil {
			n = &node{devices: map[string]bool{}}
			s.nodes[nodeID] = n
		}
		n.born = true
		m, has := p.Metric("bdSeq")
		n.bdSeq, n.hasBdSeq = m.Uint, has
		delete(s.asked, nodeID)
		if sp.DevicesOnly {
			return changed
		}
		why := ""
		if sp.edgeRe != nil && !sp.edgeRe.MatchString(t.EdgeNode) {
			why = fmt.Sprintf("edge node %q does not match sparkplug.edgeNode %q", t.EdgeNode, sp.EdgeNode)
		}
		s.put(nodeID, s.sparkplugDevice(nodeID, t, p), why)
		return true
	case sparkplug.NDEATH:
		if n == nil {
			return changed
		}
		if p != nil && n.hasBdSeq {
			if m, ok := p.Metric("bdSeq"); ok && m.Uint != n.bdSeq {
				return changed // an older session's will, after a new birth
			}
		}
		for dev := range n.devices {
			s.remove(nodeID + "/" + dev)
		}
		s.remove(nodeID)
		delete(s.nodes, nodeID)
		delete(s.asked, nodeID)
		return true
	case sparkplug.DBIRTH:
		if n == nil {
			// Its node's birth came before we connected.
			n = &node{devices: map[string]bool{}}
			s.nodes[nodeID] = n
		}
		id := nodeID + "/" + t.Device
		why := ""
		switch {
		case sp.edgeRe != nil && !sp.edgeRe.MatchString(t.EdgeNode):
			why = fmt.Sprintf("edge node %q does not match sparkplug.edgeNode %q", t.EdgeNode, sp.EdgeNode)
		case sp.deviceRe != nil && !sp.deviceRe.MatchString(t.Device):
			why = fmt.Sprintf("device %q does not match sparkplug.device %q", t.Device, sp.Device)
		}
		s.put(id, s.sparkplugDevice(id, t, p), why)
		if _, ok := s.devices[id]; ok || s.filtered[id] != "" {
			n.devices[t.Device] = true
		}
		return true
	case sparkplug.DDEATH:
		if n != nil {
			delete(n.devices, t.Device)
		}
		return s.remove(nodeID+"/"+t.Device) || changed
	case sparkplug.NDATA, sparkplug.DDATA:
		if sp.RequestRebirth && (n == nil || !n.born) && !s.asked[nodeID] && len(s.asked) < s.d.MaxDevices {
			s.asked[nodeID] = true
			s.rebirth = append(s.rebirth, sparkplug.Topic{Group: t.Group, Type: sparkplug.NCMD, EdgeNode: t.EdgeNode}.String())
		}
	}
	return changed
}

func (s *state) sparkplugDevice(id string, t sparkplug.Topic, p *sparkplug.Payload) *discoveryv1.Device {
	props := map[string]string{
		BrokerProperty: s.broker, SourceProperty: SourceSparkplug,
		SparkplugGroupProperty: t.Group, SparkplugEdgeNodeProperty: t.EdgeNode,
	}
	if t.Device != "" {
		props[SparkplugDeviceProperty] = t.Device
	}
	metrics := map[string]string{}
	size, count := 2, p.MetricCount
	for _, m := range p.Metrics {
		if !m.HasName || (t.Device == "" && m.Name == "bdSeq") {
			if m.HasName {
				count-- // bdSeq is the session's, not a metric of the node
			}
			continue
		}
		if _, dup := metrics[m.Name]; dup {
			continue
		}
		size += len(m.Name) + len(m.Datatype.String()) + 6
		if size > MaxMetricsText {
			break
		}
		metrics[m.Name] = m.Datatype.String()
	}
	b, _ := json.Marshal(metrics) // sorted keys, so equal births list alike
	props[SparkplugMetricsProperty] = string(b)
	props[SparkplugMetricCountProperty] = strconv.Itoa(count)
	return &discoveryv1.Device{Id: id, Properties: props}
}

// skip is one candidate not listed, and why.
type skip struct{ reason, candidate, message string }

// list returns the devices and what was skipped.
func (s *state) list() ([]*discoveryv1.Device, []skip) {
	var sk []skip
	devs := slices.Collect(maps.Values(s.devices))
	for id, why := range s.filtered {
		sk = append(sk, skip{SkipNoMatch, id, why})
	}
	for id := range s.overflow {
		sk = append(sk, skip{SkipOverLimit, id, fmt.Sprintf("more than maxDevices (%d) devices", s.d.MaxDevices)})
	}
	for topic, why := range s.garbage {
		sk = append(sk, skip{SkipGarbage, topic, why})
	}
	if s.connErr != "" {
		sk = append(sk, skip{SkipConnectFailed, s.broker, s.connErr})
	}
	return devs, sk
}

func skipped(sk []skip) *handler.Skipped {
	var out handler.Skipped
	for _, k := range sk {
		out.Add(k.reason, k.candidate, k.message)
	}
	return &out
}
