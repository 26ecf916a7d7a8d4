// Command dowse-udev-discovery is the udev discovery handler: it finds the
// devices attached to the node that match a Configuration's udev rules.
package main

import (
	"context"

	"github.com/dowse-dev/dowse/discovery-handlers/udev"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() {
	handler.Main(udev.DefaultName, func(ctx context.Context, s handler.Settings) error {
		return udev.Run(ctx, udev.Config{Name: s.Name, StateDir: s.StateDir, MetricsAddr: s.MetricsAddr, Logger: s.Logger})
	})
}
