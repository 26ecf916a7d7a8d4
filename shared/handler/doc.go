// Package handler is the SDK every Dowse discovery handler is built on.
//
// A protocol implements one interface, [Discoverer]. The SDK does the rest of
// the discovery contract (proto/discovery/v1): it serves DiscoveryHandler on a
// Unix socket inside the agent's state directory, registers that socket with
// the agent, registers again whenever the agent may have forgotten it, and
// drops consecutive device lists that are identical, so that every handler
// behaves the same towards the agent.
//
// The package must stay light: handler binaries ship as small containers, so
// nothing here may import controller-runtime or client-go.
package handler
