package opcua

import (
	"context"
	"errors"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/shared/handler"
)

// DefaultName is the handler name Configurations use by default.
const DefaultName = "opcua"

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

// NewDiscoverer returns the OPC UA handler.Discoverer, for callers that
// build their own handler.Server.
func NewDiscoverer() handler.Discoverer { return &discoverer{} }

// Run serves the OPC UA handler until ctx ends (then it returns nil) or the
// server fails. OPC UA servers are network devices, so the handler
// registers as shared: every node that sees a server agrees on one Instance.
func Run(ctx context.Context, cfg Config) error {
	if cfg.StateDir == "" {
		return errors.New("opcua: a state directory is required")
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
