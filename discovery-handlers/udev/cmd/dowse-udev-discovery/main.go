// Command dowse-udev-discovery is the udev discovery handler: it finds the
// devices attached to the node that match a Configuration's udev rules.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"github.com/dowse-dev/dowse/discovery-handlers/udev"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() {
	handler.TuneGC()
	cfg := udev.Config{Logger: handler.NewLogger()}
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.StringVar(&cfg.Name, "name", udev.DefaultName, "handler name that Configurations use in spec.discoveryHandler.name")
	stateDir := handler.StateDirFlag(fs)
	_ = fs.Parse(os.Args[1:]) // ExitOnError: Parse exits on a bad flag
	cfg.StateDir = *stateDir

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := udev.Run(ctx, cfg); err != nil {
		cfg.Logger.Error(err, "udev discovery handler failed")
		stop()
		os.Exit(1)
	}
}
