// Command dowse-debug-echo-discovery is the debug-echo discovery handler: it
// reports the devices a Configuration describes, for testing Dowse without
// hardware.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	debugecho "github.com/dowse-dev/dowse/discovery-handlers/debug-echo"
	"github.com/dowse-dev/dowse/shared/handler"
	"github.com/dowse-dev/dowse/shared/version"
)

func main() {
	handler.TuneGC()
	cfg := debugecho.Config{Logger: handler.NewLogger()}
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.StringVar(&cfg.Name, "name", debugecho.DefaultName, "handler name that Configurations use in spec.discoveryHandler.name")
	fs.BoolVar(&cfg.Shared, "shared", false, "report the devices as shared: visible from every node that runs this handler")
	stateDir := handler.StateDirFlag(fs)
	fs.StringVar(&cfg.MetricsAddr, "metrics-address", "", "address to serve Prometheus metrics on at /metrics, e.g. :9460 (off when empty)")
	fs.StringVar(&cfg.AvailabilityFile, "availability-file", "",
		"file whose content OFFLINE takes every device offline (default <state-dir>/"+debugecho.DefaultAvailabilityFileName+")")
	showVersion := version.Flag(fs, "dowse-debug-echo-discovery")
	_ = fs.Parse(os.Args[1:]) // ExitOnError: Parse exits on a bad flag
	if showVersion.Print(os.Stdout) {
		return
	}
	cfg.StateDir = *stateDir

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := debugecho.Run(ctx, cfg); err != nil {
		cfg.Logger.Error(err, "Debug-echo discovery handler failed")
		stop()
		os.Exit(1)
	}
}
