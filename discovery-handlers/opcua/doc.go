// Package opcua is the OPC UA discovery handler: it asks each discovery URL a
// Configuration names (an OPC UA server, or a local discovery server that
// servers register with) for the servers it knows (FindServers), checks each
// server with GetEndpoints, and reports every server that answers as one
// shared device whose id is its applicationUri.
//
// OPC UA discovery is a poll: the handler asks again every
// rediscoveryInterval, and a server that stops answering is dropped only
// after failureThreshold checks in a row have failed, so that one slow
// answer does not take a device, and its brokers, away.
package opcua
