// Package modbus is the Modbus TCP discovery handler.
//
// Modbus has no discovery of its own, so the handler probes what a
// Configuration names: host:port targets and bounded CIDR ranges, for each of
// the unit ids it lists. A (host, port, unit id) that answers the probe (a
// read of holding or input registers, or Read Device Identification,
// function 43/14) and passes the optional match is one shared device.
//
// The handler is built not to flood a plant network: connection attempts are
// rate-limited and the probes in flight bounded, ranges larger than a limit
// are refused outright, and a target that times out is backed off
// exponentially instead of being retried every round. A device that stops
// answering is dropped only after failureThreshold rounds without an answer;
// one that answers but no longer matches is dropped at once.
package modbus
