// Command dowse-opcua-discovery is the OPC UA discovery handler: it finds OPC
// UA servers through their discovery URLs and local discovery servers.
package main

import (
	"context"

	"github.com/dowse-dev/dowse/discovery-handlers/opcua"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() {
	handler.Main(opcua.DefaultName, func(ctx context.Context, s handler.Settings) error {
		return opcua.Run(ctx, opcua.Config{Name: s.Name, StateDir: s.StateDir, MetricsAddr: s.MetricsAddr, Logger: s.Logger})
	})
}
