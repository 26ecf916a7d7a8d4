// Command dowse-onvif-discovery is the ONVIF discovery handler: it finds IP
// cameras with WS-Discovery.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"github.com/dowse-dev/dowse/discovery-handlers/onvif"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() {
	handler.TuneGC()
	cfg := onvif.Config{Logger: handler.NewLogger()}
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.StringVar(&cfg.Name, "name", onvif.DefaultName, "handler name that Configurations use in spec.discoveryHandler.name")
	stateDir := handler.StateDirFlag(fs)
	_ = fs.Parse(os.Args[1:]) // ExitOnError: Parse exits on a bad flag
	cfg.StateDir = *stateDir

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := onvif.Run(ctx, cfg); err != nil {
		cfg.Logger.Error(err, "ONVIF discovery handler failed")
		stop()
		os.Exit(1)
	}
}
