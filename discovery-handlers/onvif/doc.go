// Package onvif is the ONVIF discovery handler: it finds IP cameras with
// WS-Discovery (package wsdiscovery), by probing on the node's multicast
// interfaces and by listening for the Hello and Bye that devices announce,
// then asks each camera's device service for its MAC address and the stream
// URI of its first media profile.
//
// Cameras are network devices, so the handler registers as shared; a
// camera's id is its endpoint UUID, which survives an address change.
//
// A camera is listed once its device service has answered
// GetDeviceInformation (with WS-Security credentials from the discovery
// properties: per device UUID, per MAC address, or a default pair, see
// UsernameProperty); one whose device service fails, answers garbage or
// is not where its XAddrs say is skipped with a log line and retried later.
// A camera leaves the list on its Bye, or after FailureThreshold probes in
// a row without an answer.
package onvif
