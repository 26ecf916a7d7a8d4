// Command dowse-snmp-mapper is the SNMP mapper: it serves the node's SNMP
// Devices for the Dowse agent (or KubeEdge's edgecore) over DMI v1beta1.
package main

import (
	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/snmp"
)

func main() { mapper.Main(snmp.Protocol, snmp.NewDriver) }
