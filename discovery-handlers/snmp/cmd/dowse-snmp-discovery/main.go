// Command dowse-snmp-discovery is the SNMP discovery handler: it asks the
// targets a Configuration names for SNMP agents that answer.
package main

import (
	"github.com/dowse-dev/dowse/discovery-handlers/snmp"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() { handler.Main(snmp.Handler()) }
