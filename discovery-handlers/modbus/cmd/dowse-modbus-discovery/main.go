// Command dowse-modbus-discovery is the Modbus TCP discovery handler: it probes
// the targets a Configuration names for devices that answer.
package main

import (
	"github.com/dowse-dev/dowse/discovery-handlers/modbus"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() { handler.Main(modbus.Handler()) }
