// Command dowse-mdns-discovery is the mDNS/DNS-SD discovery handler: it
// browses the service types a Configuration names on the node's links.
package main

import (
	"github.com/dowse-dev/dowse/discovery-handlers/mdns"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() { handler.Main(mdns.Handler()) }
