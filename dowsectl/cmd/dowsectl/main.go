// Command dowsectl is the operator's command line for Dowse; see package
// dowsectl. Installed as kubectl-dowse it is the kubectl plugin `kubectl
// dowse`; linked as kubectl_complete-dowse it answers kubectl's completion
// of the plugin.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/dowse-dev/dowse/dowsectl"
)

func main() {
	name, args := "dowsectl", os.Args[1:]
	switch strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe") {
	case dowsectl.PluginName:
		name = "kubectl dowse"
	case dowsectl.CompletionPluginName:
		name, args = "kubectl dowse", append([]string{"__complete"}, args...)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cmd := dowsectl.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}, name)
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		if errors.Is(err, dowsectl.ErrUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
