package modbus

import "github.com/dowse-dev/dowse/shared/handler"

// DefaultName is the handler name Configurations use by default.
const DefaultName = "modbus"

// NewDiscoverer returns the Modbus TCP handler.Discoverer, for callers that
// build their own handler.Server.
func NewDiscoverer() handler.Discoverer { return &discoverer{} }

// Handler is the Modbus TCP handler as its binary serves it (handler.Main);
// a test serves it with handler.Serve after setting the state directory and
// a logger. Modbus TCP devices are network devices, so it registers as
// shared: every node that reaches a device agrees on one Instance.
func Handler() handler.Config {
	return handler.Config{Name: DefaultName, Shared: true, Discoverer: NewDiscoverer()}
}
