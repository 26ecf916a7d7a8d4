package sparkplug

import (
	"strings"
	"unicode/utf8"
)

// Namespace is the first level of every Sparkplug B topic.
const Namespace = "spBv1.0"

// Message types (the third level of a topic).
const (
	NBIRTH = "NBIRTH"
	NDEATH = "NDEATH"
	DBIRTH = "DBIRTH"
	DDEATH = "DDEATH"
	NDATA  = "NDATA"
	DDATA  = "DDATA"
	NCMD   = "NCMD"
	DCMD   = "DCMD"
)

// Topic is a parsed spBv1.0/<group>/<type>/<edge node>[/<device>] topic.
type Topic struct {
	Group, Type, EdgeNode, Device string
}

// ParseTopic parses topic; ok is false for anything else (STATE, other
// namespaces, a node message with a device level or a device message
// without one, an empty or non-UTF-8 id).
func ParseTopic(topic string) (Topic, bool) {
	parts := strings.Split(topic, "/")
	if len(parts) < 4 || len(parts) > 5 || parts[0] != Namespace {
		return Topic{}, false
	}
	t := Topic{Group: parts[1], Type: parts[2], EdgeNode: parts[3]}
	if len(parts) == 5 {
		t.Device = parts[4]
	}
	switch t.Type {
	case NBIRTH, NDEATH, NDATA, NCMD:
		if len(parts) != 4 {
			return Topic{}, false
		}
	case DBIRTH, DDEATH, DDATA, DCMD:
		if len(parts) != 5 || t.Device == "" {
			return Topic{}, false
		}
	default:
		return Topic{}, false
	}
	if t.Group == "" || t.EdgeNode == "" || !utf8.ValidString(topic) {
		return Topic{}, false
	}
	return t, true
}

// String is the topic's text.
func (t Topic) String() string {
	s := Namespace + "/" + t.Group + "/" + t.Type + "/" + t.EdgeNode
	if t.Device != "" {
		s += "/" + t.Device
	}
	return s
}

// ValidID says whether s can be a group, edge node or device id: not
// empty, UTF-8, without the topic separator or MQTT wildcards.
func ValidID(s string) bool {
	return s != "" && utf8.ValidString(s) && !strings.ContainsAny(s, "/+#")
}
