// Command dowse-mqtt-mapper is the MQTT mapper: it serves the node's MQTT
// Devices (Sparkplug B and Home Assistant) for the Dowse agent (or
// KubeEdge's edgecore) over DMI v1beta1.
package main

import (
	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/mqtt"
)

func main() { mapper.Main(mqtt.Protocol, mqtt.NewDrivers()) }
