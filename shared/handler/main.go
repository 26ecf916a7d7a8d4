package handler

import (
	"context"
	"flag"
	"os"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/internal/command"
	"github.com/dowse-dev/dowse/internal/nodepaths"
	"github.com/dowse-dev/dowse/internal/version"
)

// Settings are what a handler binary is told on its command line.
type Settings struct {
	// Name is the handler name to register (--name).
	Name string
	// StateDir is the agent's state directory (--state-dir, DOWSE_STATE_DIR).
	StateDir string
	// SocketDir is the folder of the registration socket:
	// nodepaths.HandlerSocketDir of the command line and environment.
	SocketDir string
	// MetricsAddr is where Prometheus metrics are served (--metrics-address;
	// empty: not served), for the protocol's Config.MetricsAddr.
	MetricsAddr string
	Logger      logr.Logger
}

// Main is the whole main of a handler binary: cfg says what it serves
// (its Name, the default of --name; Shared; its Discoverer), and Main adds
// what the command line says (--name, --state-dir, --metrics-address) and a
// logger, then serves it until SIGINT or SIGTERM, as MainFunc does:
//
//	func main() { handler.Main(modbus.Handler()) }
func Main(cfg Config) {
	MainFunc(cfg.Name, nil, func(ctx context.Context, s Settings) error {
		cfg.Name, cfg.StateDir, cfg.SocketDir, cfg.MetricsAddr, cfg.Logger = s.Name, s.StateDir, s.SocketDir, s.MetricsAddr, s.Logger
		return Serve(ctx, cfg)
	})
}

// MainFunc is the whole main of a handler binary that has flags or parts
// of its own: it tunes the GC, registers --name (default defaultName),
// --state-dir, --metrics-address, --version and addFlags' flags (addFlags
// may be nil), parses them, runs run until SIGINT or SIGTERM, and exits 1
// when run fails. Only main should call it.
func MainFunc(defaultName string, addFlags func(*flag.FlagSet), run func(context.Context, Settings) error) {
	TuneGC()
	s := Settings{Logger: NewLogger()}
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.StringVar(&s.Name, "name", defaultName, "handler name that Configurations use in spec.discoveryHandler.name")
	stateDir := StateDirFlag(fs)
	fs.StringVar(&s.MetricsAddr, "metrics-address", "", "address to serve Prometheus metrics on at /metrics, e.g. :9460 (off when empty)")
	if addFlags != nil {
		addFlags(fs)
	}
	showVersion := version.Flag(fs, "dowse-"+defaultName+"-discovery")
	_ = fs.Parse(os.Args[1:]) // ExitOnError: Parse exits on a bad flag
	if showVersion.Print(os.Stdout) {
		return
	}
	s.StateDir = *stateDir
	given := ""
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "state-dir" {
			given = *stateDir
		}
	})
	s.SocketDir = nodepaths.HandlerSocketDir(given)

	ctx, stop := command.SignalContext()
	defer stop()
	if err := run(ctx, s); err != nil {
		s.Logger.Error(err, "discovery handler failed", "handler", s.Name)
		stop()
		os.Exit(1)
	}
}
