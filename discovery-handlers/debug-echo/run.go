package debugecho

import (
	"context"
	"errors"
	"path/filepath"
	"sync"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/shared/handler"
)

const (
	// DefaultName is the handler name Configurations use by default.
	DefaultName = "debug-echo"
	// DefaultAvailabilityFileName is the availability file's name inside the
	// state directory, when Config.AvailabilityFile is empty.
	DefaultAvailabilityFileName = "debug-echo-availability"
)

// Config is what Run needs.
type Config struct {
	// Name is the handler name to register; DefaultName when empty.
	Name string
	// Shared makes the devices visible from every node that runs the
	// handler, one Instance for all, as for network devices.
	Shared bool
	// StateDir is the agent's state directory (required).
	StateDir string
	// SocketDir is handler.Config.SocketDir.
	SocketDir string
	// MetricsAddr is where the handler serves Prometheus metrics
	// (handler.Config.MetricsAddr); empty: not served.
	MetricsAddr string
	// AvailabilityFile takes the devices offline while its trimmed content
	// is OFFLINE; <StateDir>/debug-echo-availability when empty.
	AvailabilityFile string
	Logger           logr.Logger
}

// Run serves the debug-echo handler until ctx ends (then it returns nil) or
// a part of it fails.
func Run(ctx context.Context, cfg Config) error {
	if cfg.StateDir == "" {
		return errors.New("debug-echo: a state directory is required")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.AvailabilityFile == "" {
		cfg.AvailabilityFile = filepath.Join(cfg.StateDir, DefaultAvailabilityFileName)
	}
	log := cfg.Logger.WithValues("handler", cfg.Name)

	avail, err := newAvailability(cfg.AvailabilityFile, log)
	if err != nil {
		return err
	}
	srv, err := handler.NewServer(handler.Config{
		Name:        cfg.Name,
		Shared:      cfg.Shared,
		StateDir:    cfg.StateDir,
		SocketDir:   cfg.SocketDir,
		MetricsAddr: cfg.MetricsAddr,
		Discoverer:  &discoverer{availability: avail},
		Logger:      cfg.Logger,
	})
	if err != nil {
		return err
	}

	// Either part failing stops the other; the first failure is returned.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg        sync.WaitGroup
		fatal     error
		fatalOnce sync.Once
	)
	for _, start := range []func(context.Context) error{avail.Start, srv.Start} {
		wg.Go(func() {
			if err := start(ctx); err != nil {
				fatalOnce.Do(func() { fatal = err })
				cancel()
			}
		})
	}
	wg.Wait()
	return fatal
}
