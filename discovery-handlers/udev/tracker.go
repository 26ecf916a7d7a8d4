package udev

import (
	"path"
	"slices"
	"strings"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// Udev event actions.
const (
	ActionAdd    = "add"
	ActionRemove = "remove"
	ActionChange = "change"
	ActionMove   = "move"
	ActionBind   = "bind"
	ActionUnbind = "unbind"
)

// Event is one udev or kernel event.
type Event struct {
	// Action is add, remove, change, move, bind, unbind, online or
	// offline.
	Action string
	Device Device
	// OldDevpath is the devpath before a move.
	OldDevpath string
}

// entry is a matched device, what of it a Discover response needs.
type entry struct {
	devnode string
	props   map[string]string
}

// tracker keeps the devices of one stream that match its rules.
type tracker struct {
	details *Details
	matched map[string]entry // by devpath
}

func newTracker(d *Details) *tracker {
	return &tracker{details: d, matched: map[string]entry{}}
}

// evaluate matches d and records or forgets it; it reports whether the
// matched set changed.
func (t *tracker) evaluate(d Device) bool {
	devpath := d.Devpath()
	var envNames []string
	hit := false
	for _, r := range t.details.rules {
		if r.Accepts(d) {
			hit = true
			for _, m := range r.Matches {
				if m.Key == KeyEnv && !m.Negate {
					envNames = append(envNames, m.Name)
				}
			}
		}
	}
	old, had := t.matched[devpath]
	if !hit {
		if had {
			delete(t.matched, devpath)
		}
		return had
	}
	e := entry{devnode: d.Devnode(), props: map[string]string{DevpathProperty: devpath}}
	if e.devnode != "" {
		e.props[DevnodeProperty] = e.devnode
	}
	if s := d.Subsystem(); s != "" {
		e.props[SubsystemProperty] = s
	}
	props := d.Properties()
	for _, names := range [][]string{IdentityProperties, envNames} {
		for _, n := range names {
			if v, ok := props[n]; ok {
				e.props[n] = v
			}
		}
	}
	t.matched[devpath] = e
	return !had || old.devnode != e.devnode || !mapsEqual(old.props, e.props)
}

// remove forgets devpath and every device below it; it reports whether the
// matched set changed.
func (t *tracker) remove(devpath string) bool {
	changed := false
	for p := range t.matched {
		if p == devpath || under(p, devpath) {
			delete(t.matched, p)
			changed = true
		}
	}
	return changed
}

// apply applies an event and reports whether the matched set changed.
func (t *tracker) apply(ev Event) bool {
	switch ev.Action {
	case ActionRemove:
		return t.remove(ev.Device.Devpath())
	case ActionMove:
		changed := false
		if ev.OldDevpath != "" {
			changed = t.remove(ev.OldDevpath)
		}
		return t.evaluate(ev.Device) || changed
	default:
		return t.evaluate(ev.Device)
	}
}

// list returns the Discover device list. With groupRecursive a matched
// device below another matched device is folded into the topmost one.
func (t *tracker) list() []*discoveryv1.Device {
	paths := make([]string, 0, len(t.matched))
	for p := range t.matched {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	var devs []*discoveryv1.Device
	byRoot := map[string]*discoveryv1.Device{}
	for _, p := range paths {
		e := t.matched[p]
		if t.details.GroupRecursive {
			if root := t.topmostMatchedAncestor(p); root != "" {
				if e.devnode != "" {
					dev := byRoot[root]
					dev.DeviceSpecs = append(dev.DeviceSpecs, t.spec(e.devnode))
					if _, ok := dev.Properties[DevnodeProperty]; !ok {
						dev.Properties[DevnodeProperty] = e.devnode
					}
				}
				continue
			}
		}
		dev := &discoveryv1.Device{Id: p, Properties: make(map[string]string, len(e.props))}
		for k, v := range e.props {
			dev.Properties[k] = v
		}
		if e.devnode != "" {
			dev.DeviceSpecs = append(dev.DeviceSpecs, t.spec(e.devnode))
		}
		byRoot[p] = dev
		devs = append(devs, dev)
	}
	return devs
}

// SkipNoDeviceNode notes a matched device that has no device node: it is
// listed, with its properties, but a broker gets no device from it. (A rule
// that matches nothing is no reason: there is no candidate.)
const SkipNoDeviceNode = "NoDeviceNode"

// skipped notes the matched devices without a device node that no matched
// ancestor gives one (groupRecursive folds them into it).
func (t *tracker) skipped() *handler.Skipped {
	var sk handler.Skipped
	for p, e := range t.matched {
		if e.devnode != "" || (t.details.GroupRecursive && t.topmostMatchedAncestor(p) != "") {
			continue
		}
		sk.Add(SkipNoDeviceNode, p, "matched, but it has no device node: listed without one ("+e.props[SubsystemProperty]+")")
	}
	return &sk
}

func (t *tracker) spec(devnode string) *discoveryv1.DeviceSpec {
	return &discoveryv1.DeviceSpec{ContainerPath: devnode, HostPath: devnode, Permissions: t.details.Permissions}
}

// topmostMatchedAncestor returns the highest matched device strictly above
// devpath, "" if none.
func (t *tracker) topmostMatchedAncestor(devpath string) string {
	top := ""
	for p := path.Dir(devpath); p != "/" && p != "." && strings.HasPrefix(p, "/"); p = path.Dir(p) {
		if _, ok := t.matched[p]; ok {
			top = p
		}
	}
	return top
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
