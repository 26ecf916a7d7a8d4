// Package deviceplugin serves the kubelet device plugins that let pods ask
// for Dowse devices: one plugin per Instance on this node
// (dowse.dev/<instance>) and one per Configuration
// (dowse.dev/<configuration>), each offering one device per capacity slot.
// Its Manager runs them, with agent/cdi's spec per Instance and agent/slots'
// claims and reclaimer. The names they use (resources, slot ids, CDI kinds
// and devices) are v1alpha1's.
//
// The lifecycle of a plugin (serve the socket, register with the kubelet,
// serve and register again when the kubelet restarts) is the Plugin type;
// what the plugin offers and answers is a separate gRPC service, so that
// both can be tested alone.
package deviceplugin
