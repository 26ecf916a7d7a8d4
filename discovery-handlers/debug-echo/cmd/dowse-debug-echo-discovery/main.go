// Command dowse-debug-echo-discovery is the debug-echo discovery handler: it
// reports the devices a Configuration describes, for testing Dowse without
// hardware.
package main

import (
	"context"
	"flag"

	debugecho "github.com/dowse-dev/dowse/discovery-handlers/debug-echo"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() {
	var cfg debugecho.Config
	handler.MainFunc(debugecho.DefaultName, func(fs *flag.FlagSet) {
		fs.BoolVar(&cfg.Shared, "shared", false, "report the devices as shared: visible from every node that runs this handler")
		fs.StringVar(&cfg.AvailabilityFile, "availability-file", "",
			"file whose content OFFLINE takes every device offline (default <state-dir>/"+debugecho.DefaultAvailabilityFileName+")")
	}, func(ctx context.Context, s handler.Settings) error {
		cfg.Name, cfg.StateDir, cfg.SocketDir, cfg.MetricsAddr, cfg.Logger = s.Name, s.StateDir, s.SocketDir, s.MetricsAddr, s.Logger
		return debugecho.Run(ctx, cfg)
	})
}
