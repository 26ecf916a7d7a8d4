// Command dowse-onvif-discovery is the ONVIF discovery handler: it finds IP
// cameras with WS-Discovery.
package main

import (
	"context"

	"github.com/dowse-dev/dowse/discovery-handlers/onvif"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() {
	handler.Main(onvif.DefaultName, func(ctx context.Context, s handler.Settings) error {
		return onvif.Run(ctx, onvif.Config{Name: s.Name, StateDir: s.StateDir, MetricsAddr: s.MetricsAddr, Logger: s.Logger})
	})
}
