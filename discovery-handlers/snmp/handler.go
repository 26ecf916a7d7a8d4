package snmp

import "github.com/dowse-dev/dowse/shared/handler"

// DefaultName is the handler name Configurations use by default.
const DefaultName = "snmp"

// NewDiscoverer returns the SNMP handler.Discoverer, for callers that build
// their own handler.Server.
func NewDiscoverer() handler.Discoverer { return &discoverer{} }

// Handler is the SNMP handler as its binary serves it (handler.Main); a
// test serves it with handler.Serve after setting the state directory and a
// logger. SNMP agents are network devices, so it registers as shared: every
// node that reaches an agent agrees on one Instance.
func Handler() handler.Config {
	return handler.Config{Name: DefaultName, Shared: true, Discoverer: NewDiscoverer()}
}
