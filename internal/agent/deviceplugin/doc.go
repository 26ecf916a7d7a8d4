// Package deviceplugin serves the kubelet device plugins that let pods ask
// for Dowse devices: one plugin per Instance on this node
// (dowse.dev/<instance>.<namespace>) and one per Configuration
// (dowse.dev/<configuration>.<namespace>), each offering one device per
// capacity slot, and one per legacy resource pods still hold slots under.
// Its Manager runs them, with internal/agent/cdi's spec per Instance and internal/agent/slots'
// claims and reclaimer. The names they use (resources, slot ids, CDI kinds
// and devices) are v1alpha1's.
//
// The lifecycle of the plugins (serve their sockets, all from one gRPC
// server, register them with the kubelet, serve and register again when
// the kubelet restarts) is the Host type; what a plugin offers and answers
// is a separate service, so that both can be tested alone. A plugin costs
// its socket and the kubelet's connection to it, most of that the
// goroutines gRPC keeps per connection (BenchmarkPluginMemory measures it).
package deviceplugin
