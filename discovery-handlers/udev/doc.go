// Package udev is the udev discovery handler: it finds the devices attached
// to a node (serial ports, cameras, disks, network interfaces, anything udev
// knows) that match a Configuration's rules, written in udev's own match
// syntax.
//
// The handler is event-driven. Each Discover stream starts following the
// udev monitor, enumerates the devices once, then applies every event as it
// arrives, so that a plugged or unplugged device reaches the agent within
// milliseconds instead of at the next poll. When no udev daemon runs (no
// /run/udev/control) it follows the kernel's uevents instead, and says so in
// a log line; udev properties (ENV{ID_*}) are then only those the kernel
// sends.
//
// Matching is done on the [Device] interface, so that the rule matcher is
// tested on fixture sysfs trees as well as on the real machine.
//
// Devices are local (not shared): the agent makes one Instance per device
// and node. A device's id is its devpath; its device node, if any, is
// handed to brokers as a device spec, and the properties UDEV_DEVPATH,
// UDEV_DEVNODE, UDEV_SUBSYSTEM plus the udev properties the matching rule
// names in ENV{...} (and a few identity properties, see
// [IdentityProperties]) as environment variables.
package udev
