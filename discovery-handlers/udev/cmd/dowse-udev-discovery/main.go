// Command dowse-udev-discovery is the udev discovery handler: it finds the
// devices attached to the node that match a Configuration's udev rules.
package main

import (
	"github.com/dowse-dev/dowse/discovery-handlers/udev"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() { handler.Main(udev.Handler()) }
