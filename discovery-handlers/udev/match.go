package udev

import "path"

// Device is one device of the node's device tree, as rules see it. The
// handler reads the real machine through libudev; tests read fixture sysfs
// trees. Implementations read lazily and may return stale values for a
// device that has just gone: a device that is gone simply stops matching.
type Device interface {
	// Devpath is the device's path below /sys, e.g.
	// /devices/virtual/mem/null. It is the device's id.
	Devpath() string
	// Sysname is the kernel name, the last element of the devpath (KERNEL).
	Sysname() string
	// Subsystem is the device's subsystem, "" if none.
	Subsystem() string
	// Driver is the bound driver, "" if none.
	Driver() string
	// Devnode is the device node's path under /dev, "" if none.
	Devnode() string
	// Properties are the device's udev properties (ENV), including those
	// the kernel sends in its uevent.
	Properties() map[string]string
	// Tags are the device's udev tags.
	Tags() []string
	// Attr reads a sysfs attribute (a file in the device's directory),
	// trailing white space removed; ok is false when it cannot be read.
	Attr(name string) (value string, ok bool)
	// Parent is the next device up the tree, nil at the top.
	Parent() Device
}

// Accepts reports whether d matches the rule.
func (r Rule) Accepts(d Device) bool {
	var parentKeys []Match
	for _, m := range r.Matches {
		if m.Parent() {
			parentKeys = append(parentKeys, m)
			continue
		}
		if !matchOne(m, d) {
			return false
		}
	}
	if len(parentKeys) == 0 {
		return true
	}
	// As in udev, every parent key must hold on one and the same device:
	// the device itself or one of its ancestors.
	for cur := d; cur != nil; cur = cur.Parent() {
		all := true
		for _, m := range parentKeys {
			if !matchOne(m, cur) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// matchOne evaluates one match on d as udev does: a property that is not
// set is "", and any match on an attribute that cannot be read fails.
func matchOne(m Match, d Device) bool {
	var ok bool
	switch m.Key {
	case KeyKernel, KeyKernels:
		ok = m.Pattern.Match(d.Sysname())
	case KeySubsystem, KeySubsystems:
		ok = m.Pattern.Match(d.Subsystem())
	case KeyDriver, KeyDrivers:
		ok = m.Pattern.Match(d.Driver())
	case KeyDevpath:
		ok = m.Pattern.Match(d.Devpath())
	case KeyAttr, KeyAttrs:
		v, found := d.Attr(m.Name)
		if !found {
			// As in udev, a match on an attribute the device does not
			// have fails, whether == or !=.
			return false
		}
		ok = m.Pattern.Match(v)
	case KeyEnv:
		ok = m.Pattern.Match(d.Properties()[m.Name])
	case KeyTag, KeyTags:
		for _, t := range d.Tags() {
			if m.Pattern.Match(t) {
				ok = true
				break
			}
		}
	}
	return ok != m.Negate
}

// under reports whether devpath is strictly below ancestor in the device
// tree.
func under(devpath, ancestor string) bool {
	return len(devpath) > len(ancestor)+1 && devpath[len(ancestor)] == '/' && devpath[:len(ancestor)] == ancestor
}

// sysname returns the last element of a devpath.
func sysname(devpath string) string { return path.Base(devpath) }
