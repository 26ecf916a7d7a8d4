// Command dowse-agent is Dowse's per-node agent. `dowse-agent node-api`
// runs the node-local API proxy instead (a static pod on nodes that keep
// running through an offline reboot).
package main

import (
	"context"
	"os"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/internal/kubeflags"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "node-api" {
		os.Args = append(os.Args[:1], os.Args[2:]...)
		var cfg agent.NodeAPIConfig
		kubeflags.Main("dowse-agent node-api", 30, cfg.AddFlags, func(ctx context.Context, log logr.Logger) error {
			return agent.RunNodeAPI(ctx, cfg, log)
		})
		return
	}
	var cfg agent.Config
	// An edge node's memory is scarcer than the agent's CPU: collect at 30%
	// heap growth instead of Go's 100%.
	kubeflags.Main("dowse-agent", 30, cfg.AddFlags, func(ctx context.Context, log logr.Logger) error {
		return agent.Run(ctx, cfg, log)
	})
}
