// Command dowse-debug-echo-broker is the sample broker for debug-echo
// devices: it logs and serves over HTTP the device environment it received.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/logr"

	debugecho "github.com/dowse-dev/dowse/brokers/debug-echo"
	"github.com/dowse-dev/dowse/internal/version"
)

func main() {
	cfg := debugecho.Config{Logger: logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, nil))}
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.StringVar(&cfg.Listen, "listen", ":8080", "HTTP listen address")
	fs.BoolVar(&cfg.Once, "once", false, "log the device environment and exit (a Job broker); fails when there is none")
	prefixes := fs.String("env-prefixes", "DEBUG_ECHO_", "comma-separated prefixes of the environment variables that describe the device")
	showVersion := version.Flag(fs, "dowse-debug-echo-broker")
	_ = fs.Parse(os.Args[1:])
	if showVersion.Print(os.Stdout) {
		return
	}
	cfg.Prefixes = strings.Split(*prefixes, ",")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := debugecho.Run(ctx, cfg); err != nil {
		cfg.Logger.Error(err, "broker failed")
		stop()
		os.Exit(1)
	}
}
