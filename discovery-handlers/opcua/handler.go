package opcua

import "github.com/dowse-dev/dowse/shared/handler"

// DefaultName is the handler name Configurations use by default.
const DefaultName = "opcua"

// NewDiscoverer returns the OPC UA handler.Discoverer, for callers that
// build their own handler.Server.
func NewDiscoverer() handler.Discoverer { return &discoverer{} }

// Handler is the OPC UA handler as its binary serves it (handler.Main); a
// test serves it with handler.Serve after setting the state directory and a
// logger. OPC UA servers are network devices, so it registers as shared:
// every node that sees a server agrees on one Instance.
func Handler() handler.Config {
	return handler.Config{Name: DefaultName, Shared: true, Discoverer: NewDiscoverer()}
}
