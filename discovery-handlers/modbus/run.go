package modbus

import (
	"context"
	"errors"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/shared/handler"
)

// DefaultName is the handler name Configurations use by default.
const DefaultName = "modbus"

// Config is what Run needs.
type Config struct {
	// Name is the handler name to register; DefaultName when empty.
	Name string
	// StateDir is the agent's state directory (required).
	StateDir string
	// MetricsAddr is where the handler serves Prometheus metrics
	// (handler.Config.MetricsAddr); empty: not served.
	MetricsAddr string
	Logger      logr.Logger
}

// NewDiscoverer returns the Modbus TCP handler.Discoverer, for callers that
// build their own handler.Server.
func NewDiscoverer() handler.Discoverer { return &discoverer{} }

// Run serves the Modbus TCP handler until ctx ends (then it returns nil) or
// the server fails. Modbus TCP devices are network devices, so the handler
// registers as shared: every node that reaches a device agrees on one
// Instance.
func Run(ctx context.Context, cfg Config) error {
	if cfg.StateDir == "" {
		return errors.New("modbus: a state directory is required")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	return handler.Serve(ctx, handler.Config{
		Name:        cfg.Name,
		Shared:      true,
		StateDir:    cfg.StateDir,
		MetricsAddr: cfg.MetricsAddr,
		Discoverer:  NewDiscoverer(),
		Logger:      cfg.Logger,
	})
}
