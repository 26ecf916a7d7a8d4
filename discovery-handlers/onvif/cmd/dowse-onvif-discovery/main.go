// Command dowse-onvif-discovery is the ONVIF discovery handler: it finds IP
// cameras with WS-Discovery.
package main

import (
	"github.com/dowse-dev/dowse/discovery-handlers/onvif"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() { handler.Main(onvif.Handler()) }
