// Package mapper is Dowse's mapper SDK: what every mapper broker (one
// process per protocol per node that reads and writes real devices) needs
// besides its protocol, speaking KubeEdge's DMI v1beta1 to the node's device
// manager (the Dowse agent on <state-dir>/dmi.sock, or KubeEdge's edgecore),
// so the same mappers run under either.
//
// A protocol implements Driver (Prepare a property's visitor, Connect,
// Read, Write, Close; optionally BatchReader and Subscriber) and its main is
// one call:
//
//	func main() { mapper.Main("modbus", modbus.NewDriver) }
//
// What the SDK does for every protocol:
//   - Registration: MapperRegister with data on start (the answer's devices
//     and models are served), again whenever the connection to the manager
//     comes back (it restarted) and every ReregisterInterval; the answer is
//     reconciled (new devices start, missing ones stop).
//   - DeviceMapperService on its own socket in the state directory, for
//     RegisterDevice, UpdateDevice, RemoveDevice and the model calls.
//   - One goroutine and one connection per device. Properties are read on
//     their collectCycle; those of one device sharing a cycle are handed to
//     a BatchReader together. A desired value that arrives during a read is
//     written when that read ends, before the rest of the round.
//   - Reports on change: a value is reported when it differs from the last
//     report (numbers: by more than the visitor's "deadband"), at least every
//     reportCycle as a heartbeat, and the first value always. One
//     ReportDeviceStatus carries every property of the device that is due,
//     over one long-lived gRPC connection.
//   - Typed values: the model's type, the visitor's "scale" and "offset"
//     (value = raw*scale + offset), and RegisterCodec for word-based
//     protocols (int16 ... float64, bool, string, byte and word order, bit
//     masks). A desired value is parsed as the model type, checked against
//     the model's minimum and maximum, put through the inverse transform,
//     written, and read back; it is then the twin's observedDesired. A
//     refused or failed one leaves observedDesired alone and puts metadata
//     "desiredError" on the reported twin; a failed read puts "error" there
//     (with the last good value). A property never read is not reported
//     (a device manager refuses twins without a value of their type); its
//     error shows in GetDevice.
//   - Updates: an UpdateDevice that changes only desired values writes them
//     on the open connection; changed properties are prepared again on the
//     open connection; a changed protocol config reconnects.
//   - Health: ok; unhealthy after UnhealthyAfter read rounds in a row that
//     all failed (then a reconnect); offline while it cannot connect, or
//     from a pushed ErrDeviceOffline (the device announced it is gone)
//     until its next value;
//     reconnects with exponential backoff; each change is sent with
//     ReportDeviceStates.
//   - Refused logins (a Connect error wrapping ErrAuthFailed): a backoff of
//     its own up to AuthRetryMax (minutes, not the reconnect pace, which
//     trips account lockouts), the Authenticated condition False with the
//     device's words (Dowse's DeviceConditions beside DMI; edgecore lacks
//     it), and a retry at once when the credentials change (a Device update,
//     or a file a Credentialed driver names).
//   - Prometheus metrics (Metrics) and Main's --version, --memory-limit
//     (the Go runtime's soft limit, default 8 MiB, 12 MiB while a pushMethod
//     sink runs, --sink-memory-limit; GOMEMLIMIT wins) and
//     --max-procs (GOMAXPROCS, default 1: a mapper waits more than it
//     computes).
//   - Memory: no copies of the specs it is handed (a device keeps its spec
//     marshalled, for GetDevice), visitors dropped once prepared, reports
//     made on a few caller goroutines so a device's goroutine stays small.
//
// Departures from KubeEdge's mapper-framework: no package globals (a Config
// and a Mapper value), reports on change over one connection instead of one
// dial per property per cycle, desired values applied without restarting
// the device, reconnects, and errors visible in the twins' metadata.
//
// Devices that cannot connect, and properties whose reads fail, keep the
// others going: every device has its own goroutine and connection, every
// exchange a timeout.
package mapper
