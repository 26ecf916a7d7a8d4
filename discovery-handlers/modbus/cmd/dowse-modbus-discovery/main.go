// Command dowse-modbus-discovery is the Modbus TCP discovery handler: it probes
// the targets a Configuration names for devices that answer.
package main

import (
	"context"

	"github.com/dowse-dev/dowse/discovery-handlers/modbus"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() {
	handler.Main(modbus.DefaultName, func(ctx context.Context, s handler.Settings) error {
		return modbus.Run(ctx, modbus.Config{Name: s.Name, StateDir: s.StateDir, MetricsAddr: s.MetricsAddr, Logger: s.Logger})
	})
}
