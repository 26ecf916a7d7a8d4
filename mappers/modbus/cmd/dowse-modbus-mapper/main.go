// Command dowse-modbus-mapper is the Modbus TCP mapper: it serves the
// node's Modbus Devices for the Dowse agent (or KubeEdge's edgecore) over
// DMI v1beta1.
package main

import (
	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/modbus"
)

func main() { mapper.Main(modbus.Protocol, modbus.NewDriver) }
