// Command dowse-modbus-discovery is the Modbus TCP discovery handler: it probes
// the targets a Configuration names for devices that answer.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"github.com/dowse-dev/dowse/discovery-handlers/modbus"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() {
	handler.TuneGC()
	cfg := modbus.Config{Logger: handler.NewLogger()}
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.StringVar(&cfg.Name, "name", modbus.DefaultName, "handler name that Configurations use in spec.discoveryHandler.name")
	stateDir := handler.StateDirFlag(fs)
	_ = fs.Parse(os.Args[1:]) // ExitOnError: Parse exits on a bad flag
	cfg.StateDir = *stateDir

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := modbus.Run(ctx, cfg); err != nil {
		cfg.Logger.Error(err, "Modbus discovery handler failed")
		stop()
		os.Exit(1)
	}
}
