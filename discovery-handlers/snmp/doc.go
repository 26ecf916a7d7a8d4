// Package snmp is the SNMP discovery handler.
//
// SNMP agents do not announce themselves, so the handler asks what a
// Configuration names: host:port targets and bounded CIDR ranges. Each
// target gets one GET of sysDescr, sysObjectID, sysName and sysUpTime
// (SNMPv1, v2c with a community, or v3 with a USM user, the credentials
// from the Configuration's discoveryProperties, normally a Secret). An
// agent that answers and passes the optional match (a sysObjectID prefix,
// RE2 expressions on sysDescr and sysName) is one shared device.
//
// The handler is built not to flood a network: packets are rate-limited
// (50 a second by default; a v3 probe costs two, the engine discovery and
// the GET), probes in flight bounded, ranges larger than a limit refused
// outright, and a request is never retried within a round. An agent that
// stops answering is dropped only after failureThreshold rounds without an
// answer; one that answers but no longer matches, or refuses the
// credentials, is dropped at once. Whatever an agent answers is bounded:
// values are cut to 255 bytes of valid UTF-8, and an answer that is not
// SNMP (or that the decoder chokes on) is a clear error for that target
// alone.
package snmp
