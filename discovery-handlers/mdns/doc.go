// Package mdns is the mDNS/DNS-SD discovery handler (RFC 6762, RFC 6763).
//
// It browses the service types a Configuration names (_http._tcp,
// _ipp._tcp, _esphomelib._tcp, ...) on the node's links: it joins the mDNS
// group, queries for each type (then less and less often, up to
// queryInterval), keeps what responders answer and announce until its TTL
// runs out or a goodbye (TTL 0) ends it, and asks for what an instance
// lacks. A service with an SRV record whose instance name and TXT record
// pass the Configuration's filters is one shared device, with its host,
// port, addresses and TXT entries in its properties.
//
// What comes from the wire is bounded: messages of at most 9000 bytes, 256
// records a message, 8 records of one name and type, maxServices services,
// 64 TXT entries of at most 2048 bytes in all; a flood costs its own
// packets (a full queue drops them), never the stream.
package mdns
