package udev

import "github.com/dowse-dev/dowse/shared/handler"

// DefaultName is the handler name Configurations use by default.
const DefaultName = "udev"

// Handler is the udev handler as its binary serves it (handler.Main), over
// the machine's devices (NewSource); a test serves it with handler.Serve
// after setting the state directory and a logger. udev devices are
// attached to the node, so it registers as not shared: each node's device
// is its own Instance.
func Handler() handler.Config {
	return handler.Config{Name: DefaultName, Shared: false, Discoverer: NewDiscoverer(NewSource())}
}
