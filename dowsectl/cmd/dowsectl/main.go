// Command dowsectl is the operator's command line for Dowse; see package
// dowsectl.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/dowse-dev/dowse/dowsectl"
	"github.com/dowse-dev/dowse/shared/version"
)

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version" || os.Args[1] == "version") {
		fmt.Println(version.Line("dowsectl"))
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := dowsectl.Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, dowsectl.ErrUsage) {
			if err != dowsectl.ErrUsage {
				fmt.Fprintln(os.Stderr, "dowsectl:", err)
			}
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "dowsectl:", err)
		os.Exit(1)
	}
}
