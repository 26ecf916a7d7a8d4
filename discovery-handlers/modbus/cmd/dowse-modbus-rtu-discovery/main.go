// Command dowse-modbus-rtu-discovery is the Modbus RTU discovery handler:
// it probes the serial ports of its node for units that answer, at the
// baud rates and framings a Configuration names.
package main

import (
	"github.com/dowse-dev/dowse/discovery-handlers/modbus"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() { handler.Main(modbus.RTUHandler()) }
