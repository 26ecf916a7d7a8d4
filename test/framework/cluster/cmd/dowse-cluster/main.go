// Command dowse-cluster starts and stops the single-node test cluster of
// test/framework/cluster by hand, for the demo and for poking at it:
//
//	dowse-cluster up [-state DIR] [ARCHIVE.tar ...]   # prints the kubeconfig path
//	dowse-cluster down -state DIR
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/dowse-dev/dowse/test/framework/cluster"
)

type config struct {
	cmd      string
	stateDir string
	images   []string
}

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "up" && os.Args[1] != "down") {
		fmt.Fprintln(os.Stderr, "usage: dowse-cluster up [-state DIR] [ARCHIVE.tar ...] | down -state DIR")
		os.Exit(2)
	}
	cfg := config{cmd: os.Args[1]}
	fs := flag.NewFlagSet(cfg.cmd, flag.ExitOnError)
	fs.StringVar(&cfg.stateDir, "state", "", "state directory (up: a new one under /tmp when empty)")
	_ = fs.Parse(os.Args[2:])
	cfg.images = fs.Args()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "dowse-cluster:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	switch cfg.cmd {
	case "up":
		c, err := cluster.Start(ctx, cluster.Options{StateDir: cfg.stateDir, Images: cfg.images, Detach: true})
		if err != nil {
			return err
		}
		fmt.Printf("cluster up: state %s\nexport KUBECONFIG=%s\nstop it with: dowse-cluster down -state %s\n", c.StateDir, c.Kubeconfig, c.StateDir)
		return nil
	default:
		if cfg.stateDir == "" {
			return fmt.Errorf("down needs -state")
		}
		c, err := cluster.Attach(cfg.stateDir)
		if err != nil {
			return err
		}
		if err := c.Stop(); err != nil {
			return err
		}
		fmt.Printf("cluster down; logs kept in %s/logs\n", cfg.stateDir)
		return nil
	}
}
