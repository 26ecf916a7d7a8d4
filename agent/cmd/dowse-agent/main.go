// Command dowse-agent is Dowse's per-node agent.
package main

import (
	"context"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/internal/kubeflags"
)

func main() {
	var cfg agent.Config
	// An edge node's memory is scarcer than the agent's CPU: collect at 30%
	// heap growth instead of Go's 100%.
	kubeflags.Main("dowse-agent", 30, cfg.AddFlags, func(ctx context.Context, log logr.Logger) error {
		return agent.Run(ctx, cfg, log)
	})
}
