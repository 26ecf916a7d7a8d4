// Command dowse-opcua-discovery is the OPC UA discovery handler: it finds OPC
// UA servers through their discovery URLs and local discovery servers.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"github.com/dowse-dev/dowse/discovery-handlers/opcua"
	"github.com/dowse-dev/dowse/shared/handler"
)

func main() {
	handler.TuneGC()
	cfg := opcua.Config{Logger: handler.NewLogger()}
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.StringVar(&cfg.Name, "name", opcua.DefaultName, "handler name that Configurations use in spec.discoveryHandler.name")
	stateDir := handler.StateDirFlag(fs)
	_ = fs.Parse(os.Args[1:]) // ExitOnError: Parse exits on a bad flag
	cfg.StateDir = *stateDir

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := opcua.Run(ctx, cfg); err != nil {
		cfg.Logger.Error(err, "OPC UA discovery handler failed")
		stop()
		os.Exit(1)
	}
}
