package udev

import (
	"errors"
	"fmt"

	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/shared/handler"
)

// Device properties handed to brokers as environment variables.
const (
	DevpathProperty   = "UDEV_DEVPATH"
	DevnodeProperty   = "UDEV_DEVNODE"
	SubsystemProperty = "UDEV_SUBSYSTEM"
)

// IdentityProperties are udev properties copied into a device's properties
// when the device has them, whether or not a rule names them: what a broker
// usually needs to tell one device from another.
var IdentityProperties = []string{
	"ID_VENDOR_ID", "ID_MODEL_ID", "ID_SERIAL", "ID_SERIAL_SHORT", "ID_PATH",
	"ID_FS_LABEL", "ID_FS_UUID", "ID_FS_TYPE", "INTERFACE", "DEVTYPE",
}

// DefaultPermissions are the cgroup permissions of device nodes.
const DefaultPermissions = "rwm"

// Details are a Configuration's discoveryDetails for udev, e.g.
//
//	udevRules:
//	- 'SUBSYSTEM=="video4linux", ATTR{index}=="0"'
//	- 'SUBSYSTEM=="tty", ATTRS{idVendor}=="0403"'
//	groupRecursive: true
//	permissions: rw
type Details struct {
	// UDevRules are rules in udev's match syntax; a device that matches
	// any of them is discovered. Required.
	UDevRules []string `json:"udevRules"`
	// GroupRecursive makes a matched device and the matched devices below
	// it in the device tree one device: the topmost one, whose device
	// specs hold the device nodes of all of them.
	GroupRecursive bool `json:"groupRecursive,omitempty"`
	// Permissions are the cgroup permissions given to device nodes, any
	// of r, w and m, each at most once. Default rwm.
	Permissions string `json:"permissions,omitempty"`

	rules []Rule
}

// Rules returns the parsed rules, in order.
func (d *Details) Rules() []Rule { return d.rules }

// ParseDetails parses and validates discovery_details (JSON or YAML) and
// fills in defaults. Unknown fields are errors. Its errors are
// InvalidArgument statuses naming the bad field (and for a rule, its index
// and column), ready to return from Discover.
func ParseDetails(s string) (*Details, error) {
	var d Details
	if err := yaml.UnmarshalStrict([]byte(s), &d); err != nil {
		return nil, handler.InvalidDetails("%v", err)
	}
	if len(d.UDevRules) == 0 {
		return nil, handler.InvalidDetails("udevRules: at least one rule is required")
	}
	for i, text := range d.UDevRules {
		r, err := ParseRule(i, text)
		if err != nil {
			var pe *ParseError
			if errors.As(err, &pe) {
				return nil, handler.InvalidDetails("%s (rule %q)", pe.Error(), text)
			}
			return nil, handler.InvalidDetails("udevRules[%d]: %v", i, err)
		}
		d.rules = append(d.rules, r)
	}
	if d.Permissions == "" {
		d.Permissions = DefaultPermissions
	}
	if err := checkPermissions(d.Permissions); err != nil {
		return nil, handler.InvalidDetails("permissions: %q %v", d.Permissions, err)
	}
	return &d, nil
}

func checkPermissions(p string) error {
	seen := map[rune]bool{}
	for _, c := range p {
		if c != 'r' && c != 'w' && c != 'm' {
			return fmt.Errorf("holds %q: only r, w and m are allowed", c)
		}
		if seen[c] {
			return fmt.Errorf("repeats %q", c)
		}
		seen[c] = true
	}
	return nil
}
