package mqtt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// haKeys are the config keys that become properties, each with its
// abbreviation (Home Assistant's MQTT discovery accepts both).
var haKeys = []struct{ long, short, prop string }{
	{"unique_id", "uniq_id", HAUniqueIDProperty},
	{"name", "name", HANameProperty},
	{"state_topic", "stat_t", HAStateTopicProperty},
	{"command_topic", "cmd_t", HACommandTopicProperty},
	{"availability_topic", "avty_t", HAAvailabilityTopicProperty},
	{"device_class", "dev_cla", HADeviceClassProperty},
	{"unit_of_measurement", "unit_of_meas", HAUnitProperty},
	{"value_template", "val_tpl", HAValueTemplateProperty},
	{"payload_on", "pl_on", HAPayloadOnProperty},
	{"payload_off", "pl_off", HAPayloadOffProperty},
}

var haDeviceKeys = []struct{ long, short, prop string }{
	{"name", "name", HADeviceNameProperty},
	{"manufacturer", "mf", HADeviceManufacturerProperty},
	{"model", "mdl", HADeviceModelProperty},
}

// haTopic is a parsed <prefix>/<component>/[<node_id>/]<object_id>/config.
type haTopic struct{ component, nodeID, objectID string }

func parseHATopic(prefix, topic string) (haTopic, bool) {
	rest, ok := strings.CutPrefix(topic, prefix+"/")
	if !ok {
		return haTopic{}, false
	}
	rest, ok = strings.CutSuffix(rest, "/config")
	if !ok {
		return haTopic{}, false
	}
	parts := strings.Split(rest, "/")
	var t haTopic
	switch len(parts) {
	case 2:
		t = haTopic{component: parts[0], objectID: parts[1]}
	case 3:
		t = haTopic{component: parts[0], nodeID: parts[1], objectID: parts[2]}
		if !haIDRe.MatchString(t.nodeID) {
			return haTopic{}, false
		}
	default:
		return haTopic{}, false
	}
	return t, haComponentRe.MatchString(t.component) && haIDRe.MatchString(t.objectID)
}

// haDeviceComponent is the component of a device-based discovery topic
// (<prefix>/device/[<node_id>/]<object_id>/config), whose config lists
// its entities ("components", "cmps"), each with its own platform ("p").
const haDeviceComponent = "device"

// maxHAComponents bounds the components of one device-based config.
const maxHAComponents = 256

func (s *state) homeAssistant(topic string, payload []byte) bool {
	ha := s.d.HomeAssistant
	t, ok := parseHATopic(ha.Prefix, topic)
	if !ok {
		return s.noteGarbage(topic, "not a discovery topic <prefix>/<component>/[<node_id>/]<object_id>/config")
	}
	if t.component == haDeviceComponent {
		return s.haDevice(t, topic, payload)
	}
	if len(ha.Components) > 0 && !slices.Contains(ha.Components, t.component) {
		return false
	}
	id := strings.TrimSuffix(topic, "/config")
	if len(payload) == 0 {
		// An empty config removes the entity.
		g := s.clearGarbage(topic)
		return s.remove(id) || g
	}
	if len(payload) > s.d.MaxPayload {
		s.remove(id)
		s.noteGarbage(topic, fmt.Sprintf("a %d-byte payload, more than maxPayload (%d)", len(payload), s.d.MaxPayload))
		return true
	}
	cfg, err := haObject(payload)
	var props map[string]string
	if err == nil {
		props, err = s.haProperties(t, topic, cfg)
	}
	if err != nil {
		// What was announced before no longer stands.
		s.remove(id)
		s.noteGarbage(topic, err.Error())
		return true
	}
	s.clearGarbage(topic)
	s.putHA(id, t, props)
	return true
}

// haDevice applies a device-based discovery config: each of its
// components is a device of its own (as if announced on its own topic),
// with the device's shared options ("~", topics, "dev") under the
// component's own. A component that is gone from the next config, or
// whose config is emptied (only its platform left, as Home Assistant asks
// before a component is dropped), is removed; an empty payload removes
// them all. A component whose config is wrong is skipped (Garbage) and
// the others stand.
func (s *state) haDevice(t haTopic, topic string, payload []byte) bool {
	base := strings.TrimSuffix(topic, "/config")
	old := s.haDevices[base]
	changed := false
	// present are the components of this config (as device ids); what
	// was there before and is not any more goes, garbage or not.
	present := map[string]bool{}
	settle := func() bool {
		for _, id := range old {
			if !present[id] {
				changed = s.remove(id) || changed
				changed = s.clearGarbage(id) || changed
			}
		}
		if len(present) == 0 {
			delete(s.haDevices, base)
		} else {
			s.haDevices[base] = slices.Sorted(maps.Keys(present))
		}
		return changed
	}
	if len(payload) == 0 {
		changed = s.clearGarbage(topic)
		return settle()
	}
	fail := func(why string) bool {
		s.noteGarbage(topic, why)
		changed = true
		return settle()
	}
	if len(payload) > s.d.MaxPayload {
		return fail(fmt.Sprintf("a %d-byte payload, more than maxPayload (%d)", len(payload), s.d.MaxPayload))
	}
	cfg, err := haObject(payload)
	if err != nil {
		return fail(err.Error())
	}
	raw, ok := first(cfg, "components", "cmps")
	var comps map[string]json.RawMessage
	if !ok || json.Unmarshal(raw, &comps) != nil || comps == nil {
		return fail(`a device config without components ("components" or "cmps": an object of component configs)`)
	}
	if len(comps) > maxHAComponents {
		return fail(fmt.Sprintf("%d components, more than %d", len(comps), maxHAComponents))
	}
	if _, tracked := s.haDevices[base]; !tracked && len(s.haDevices) >= s.d.MaxDevices {
		return fail(fmt.Sprintf("more than maxDevices (%d) device configs", s.d.MaxDevices))
	}
	changed = s.clearGarbage(topic)
	shared := map[string]json.RawMessage{}
	for k, v := range cfg {
		switch k {
		case "components", "cmps", "origin", "o":
		default:
			shared[k] = v
		}
	}
	bad := func(id, why string) {
		changed = s.remove(id) || changed
		changed = s.noteGarbage(id, why) || changed
	}
	for _, key := range slices.Sorted(maps.Keys(comps)) {
		id := base + "/" + key
		if !haIDRe.MatchString(key) {
			s.noteGarbage(topic, fmt.Sprintf("component id %q is not [a-zA-Z0-9_-]{1,255}", key))
			changed = true
			continue
		}
		present[id] = true
		var own map[string]json.RawMessage
		if err := json.Unmarshal(comps[key], &own); err != nil || own == nil {
			bad(id, fmt.Sprintf("component %s: not a JSON object", key))
			continue
		}
		platform, err := haString(own, "platform", "p")
		if err == nil && !haComponentRe.MatchString(platform) {
			err = fmt.Errorf("platform (p) %q is not a component name (sensor, switch...)", platform)
		}
		if err != nil {
			bad(id, fmt.Sprintf("component %s: %v", key, err))
			continue
		}
		if len(own) == 1 || (len(s.d.HomeAssistant.Components) > 0 && !slices.Contains(s.d.HomeAssistant.Components, platform)) {
			// Emptied (its platform alone: Home Assistant's way to drop a
			// component), or of a component not followed.
			changed = s.remove(id) || changed
			changed = s.clearGarbage(id) || changed
			continue
		}
		merged := maps.Clone(shared)
		maps.Copy(merged, own)
		ct := haTopic{component: platform, nodeID: t.nodeID, objectID: t.objectID}
		props, err := s.haProperties(ct, topic, merged)
		if err != nil {
			bad(id, fmt.Sprintf("component %s: %v", key, err))
			continue
		}
		props[HAComponentIDProperty] = key
		changed = s.clearGarbage(id) || changed
		s.putHA(id, ct, props)
		changed = true
	}
	return settle()
}

// putHA lists an entity's device, or holds it back by the filters.
func (s *state) putHA(id string, t haTopic, props map[string]string) {
	ha := s.d.HomeAssistant
	why := ""
	for _, f := range []struct {
		field, value string
		re           interface{ MatchString(string) bool }
		ok           bool
	}{{"nodeId", t.nodeID, ha.nodeRe, ha.nodeRe != nil}, {"objectId", t.objectID, ha.objectRe, ha.objectRe != nil},
		{"deviceManufacturer", props[HADeviceManufacturerProperty], ha.mfRe, ha.mfRe != nil},
		{"deviceModel", props[HADeviceModelProperty], ha.modelRe, ha.modelRe != nil}} {
		if f.ok && !f.re.MatchString(f.value) {
			why = fmt.Sprintf("%q does not match homeAssistant.%s", f.value, f.field)
			break
		}
	}
	s.put(id, &discoveryv1.Device{Id: id, Properties: props}, why)
}

// haObject reads a config payload as a JSON object.
func haObject(payload []byte) (map[string]json.RawMessage, error) {
	var cfg map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(payload))
	if err := dec.Decode(&cfg); err != nil || cfg == nil {
		if err == nil {
			err = fmt.Errorf("null")
		}
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("not a JSON object: data after the object")
	}
	return cfg, nil
}

// haProperties reads a config: a JSON object whose keys of interest hold
// strings (numbers and booleans are taken as their JSON text), with "~"
// expanded in topics as Home Assistant does.
func (s *state) haProperties(t haTopic, topic string, cfg map[string]json.RawMessage) (map[string]string, error) {
	base, err := haString(cfg, "~", "~")
	if err != nil {
		return nil, err
	}
	props := map[string]string{BrokerProperty: s.broker, SourceProperty: SourceHomeAssistant,
		HAComponentProperty: t.component, HAObjectIDProperty: t.objectID, HAConfigTopicProperty: topic}
	if t.nodeID != "" {
		props[HANodeIDProperty] = t.nodeID
	}
	for _, k := range haKeys {
		v, err := haString(cfg, k.long, k.short)
		if err != nil {
			return nil, err
		}
		if strings.HasSuffix(k.long, "_topic") && base != "" {
			if r, ok := strings.CutPrefix(v, "~"); ok {
				v = base + r
			} else if r, ok := strings.CutSuffix(v, "~"); ok {
				v = r + base
			}
		}
		if v != "" {
			props[k.prop] = v
		}
	}
	if raw, ok := first(cfg, "device", "dev"); ok {
		var dev map[string]json.RawMessage
		if err := json.Unmarshal(raw, &dev); err != nil || dev == nil {
			return nil, fmt.Errorf("device: not a JSON object")
		}
		for _, k := range haDeviceKeys {
			v, err := haString(dev, k.long, k.short)
			if err != nil {
				return nil, fmt.Errorf("device.%w", err)
			}
			if v != "" {
				props[k.prop] = v
			}
		}
		if raw, ok := first(dev, "identifiers", "ids"); ok {
			var ids []string
			var one string
			if json.Unmarshal(raw, &one) == nil {
				ids = []string{one}
			} else if err := json.Unmarshal(raw, &ids); err != nil {
				return nil, fmt.Errorf("device.identifiers: not a string or a list of strings")
			}
			b, _ := json.Marshal(ids)
			if len(b) > MaxHAValue {
				return nil, fmt.Errorf("device.identifiers: longer than %d bytes", MaxHAValue)
			}
			props[HADeviceIdentifiersProperty] = string(b)
		}
	}
	return props, nil
}

func first(m map[string]json.RawMessage, long, short string) (json.RawMessage, bool) {
	if v, ok := m[long]; ok {
		return v, true
	}
	v, ok := m[short]
	return v, ok
}

// haString reads key (or its abbreviation) as a string: a JSON string, or
// the text of a number or boolean; "" when absent or null.
func haString(m map[string]json.RawMessage, long, short string) (string, error) {
	raw, ok := first(m, long, short)
	if !ok {
		return "", nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", fmt.Errorf("%s: %w", long, err)
	}
	var s string
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		s = x
	case float64:
		s = strings.TrimSpace(string(raw))
	case bool:
		s = strconv.FormatBool(x)
	default:
		return "", fmt.Errorf("%s: not a string", long)
	}
	if len(s) > MaxHAValue || !utf8.ValidString(s) {
		return "", fmt.Errorf("%s: not UTF-8 of at most %d bytes", long, MaxHAValue)
	}
	return s, nil
}
