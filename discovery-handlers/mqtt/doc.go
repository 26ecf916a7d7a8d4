// Package mqtt is the MQTT discovery handler: devices that announce
// themselves on a broker.
//
// One Discover stream (one Configuration) is one client of the broker its
// details name (tcp://, ssl://, ws:// or wss://, with a user, password and
// TLS material from discovery properties, normally resolved from Secrets).
// It follows two conventions:
//
//   - Sparkplug B: an edge node's NBIRTH and a device's DBIRTH make a
//     device (spBv1.0/<group>/<edge node>[/<device>]) whose properties name
//     its group, edge node, device and metrics with their data types; a
//     DDEATH removes the device, an NDEATH the node and all its devices
//     (unless its bdSeq says it belongs to an older session). Births are
//     not retained, so a node is seen once it (re)births after the handler
//     connected; requestRebirth asks nodes seen sending data for a rebirth.
//   - Home Assistant MQTT discovery: each retained
//     homeassistant/<component>/[<node_id>/]<object_id>/config JSON object
//     is a device with its state and command topics and its device's
//     identifiers in the properties; an empty config removes it.
//
// What comes from the broker is bounded: payloads over maxPayload bytes,
// metrics past maxMetrics a birth, devices past maxDevices are not taken,
// and a payload that is not what its topic says is skipped with a reason
// (Garbage) in the Configuration's status, never fatal to the stream.
package mqtt
