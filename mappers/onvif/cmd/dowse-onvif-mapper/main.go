// Command dowse-onvif-mapper is the ONVIF mapper: it reports the node's
// ONVIF cameras' device information, stream and snapshot URIs and clock
// for the Dowse agent (or KubeEdge's edgecore) over DMI v1beta1.
package main

import (
	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/onvif"
)

func main() { mapper.Main(onvif.Protocol, onvif.NewDriver) }
