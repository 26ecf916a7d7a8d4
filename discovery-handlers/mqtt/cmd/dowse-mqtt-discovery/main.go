// Command dowse-mqtt-discovery is the MQTT discovery handler: Sparkplug B
// edge nodes and devices, and Home Assistant MQTT discovery entities,
// announced on the broker a Configuration names.
package main

import (
	"github.com/dowse-dev/dowse/discovery-handlers/mqtt"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() { handler.Main(mqtt.Handler()) }
