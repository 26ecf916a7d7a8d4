package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

// EnvFile is the file in the demo's folder that --tutorial writes: shell
// exports for the tutorials' commands (docs/tutorials), which a person
// sources and test/suites/tutorials reads the same way.
const EnvFile = "env"

// serveTutorial writes <dir>/env once the cluster is up, says how to use
// it, and waits for Ctrl-C. Nothing is applied: the tutorials do that.
func serveTutorial(ctx context.Context, dir, kubeconfig, modbusAddr string) error {
	root, bin := kube.RepoRoot(), procs.BinDir()
	// kubectl finds plugins on PATH by name: kubectl-dowse is dowsectl.
	plugins := filepath.Join(dir, "bin")
	if err := os.MkdirAll(plugins, 0o755); err != nil {
		return err
	}
	if err := os.Symlink(filepath.Join(bin, "dowsectl"), filepath.Join(plugins, "kubectl-dowse")); err != nil {
		return err
	}
	vars := []struct{ name, value, why string }{
		{"KUBECONFIG", kubeconfig, "the demo's API server"},
		{"DOWSE", root, "the Dowse repository: samples/, test/peers/"},
		{"DOWSE_STATE_DIR", dir, "the agent's state directory: handlers and mappers started by hand find the agent's sockets there"},
		{"DEMO_NODE", processNode, "the node the demo's agent runs as"},
		{"DEMO_MODBUS", modbusAddr, "the demo's Modbus TCP controller"},
	}
	var b strings.Builder
	b.WriteString("# The demo cluster's settings for docs/tutorials (written by hack/demo --tutorial): source this file.\n")
	for _, v := range vars {
		fmt.Fprintf(&b, "# %s\nexport %s=%q\n", v.why, v.name, v.value)
	}
	fmt.Fprintf(&b, "# kubectl (bin/k8s), dowsectl and its kubectl plugin kubectl-dowse\nexport PATH=%q:\"$PATH\"\n",
		strings.Join([]string{plugins, bin, kube.BinDir()}, ":"))
	env := filepath.Join(dir, EnvFile)
	// Written whole and then renamed, so that a reader never sees half of it.
	if err := os.WriteFile(env+".tmp", []byte(b.String()), 0o644); err != nil {
		return err
	}
	if err := os.Rename(env+".tmp", env); err != nil {
		return err
	}
	say("the cluster is up for the tutorials (docs/tutorials); in another terminal:")
	say("  source %s", env)
	say("Ctrl-C stops it")
	<-ctx.Done()
	return ctx.Err()
}
