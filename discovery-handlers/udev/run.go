package udev

import (
	"context"
	"errors"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/shared/handler"
)

// DefaultName is the handler name Configurations use by default.
const DefaultName = "udev"

// Config is what Run needs.
type Config struct {
	// Name is the handler name to register; DefaultName when empty.
	Name string
	// StateDir is the agent's state directory (required).
	StateDir string
	// MetricsAddr is where the handler serves Prometheus metrics
	// (handler.Config.MetricsAddr); empty: not served.
	MetricsAddr string
	// Source reads the machine's devices; NewSource() when nil.
	Source Source
	Logger logr.Logger
}

// Run serves the udev handler until ctx ends (then it returns nil) or the
// server fails. udev devices are attached to the node, so the handler
// registers as not shared: each node's device is its own Instance.
func Run(ctx context.Context, cfg Config) error {
	if cfg.StateDir == "" {
		return errors.New("udev: a state directory is required")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Source == nil {
		cfg.Source = NewSource()
	}
	if m, ok := cfg.Source.(interface{ Mode() string }); ok {
		switch m.Mode() {
		case ModeKernel:
			cfg.Logger.Info("no udev daemon runs: following kernel uevents, so udev properties (ENV{ID_*}) are only those the kernel sends", "controlSocket", DefaultControlSocket)
		case ModeUdev:
			cfg.Logger.Info("following the udev daemon's events")
		}
	}
	return handler.Serve(ctx, handler.Config{
		Name:        cfg.Name,
		Shared:      false,
		StateDir:    cfg.StateDir,
		MetricsAddr: cfg.MetricsAddr,
		Discoverer:  NewDiscoverer(cfg.Source),
		Logger:      cfg.Logger,
	})
}
