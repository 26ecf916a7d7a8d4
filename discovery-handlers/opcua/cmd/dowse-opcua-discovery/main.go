// Command dowse-opcua-discovery is the OPC UA discovery handler: it finds OPC
// UA servers through their discovery URLs and local discovery servers.
package main

import (
	"github.com/dowse-dev/dowse/discovery-handlers/opcua"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() { handler.Main(opcua.Handler()) }
