// Command dowse-opcua-mapper is the OPC UA mapper: it serves the node's
// OPC UA Devices for the Dowse agent (or KubeEdge's edgecore) over DMI
// v1beta1, with reads, writes and subscriptions.
package main

import (
	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/opcua"
)

func main() { mapper.Main(opcua.Protocol, opcua.NewDriver) }
