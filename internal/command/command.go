// Package command is the set-up Dowse's binaries share before they run:
// the garbage collector's target, the logger of the binaries without
// controller-runtime (discovery handlers and mappers), --state-dir, and the
// context that ends at SIGINT or SIGTERM. It links only the standard
// library, logr and internal/nodepaths, so that the handler and mapper SDKs
// may take it; internal/kubeflags builds on it for the binaries with a
// Kubernetes client.
package command

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/internal/nodepaths"
)

// TuneGC makes the process collect garbage at percent heap growth instead
// of Go's 100%, unless GOGC is set or percent is not above 0: on an edge
// node memory is scarcer than the little CPU this costs. Call it first
// thing in main; it changes the whole process.
func TuneGC(percent int) {
	if percent > 0 && os.Getenv("GOGC") == "" {
		debug.SetGCPercent(percent)
	}
}

// NewLogger is the logger of handler and mapper binaries: JSON lines on
// stderr, through log/slog, so that they need no logging module beyond
// logr.
func NewLogger() logr.Logger {
	return logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, nil))
}

// StateDirFlag registers --state-dir on fs; holding says what the binary
// finds there. Its default is nodepaths.StateDir(""), read when StateDirFlag
// is called, so --help shows the directory the binary would really use and
// the flag still wins over the environment.
func StateDirFlag(fs *flag.FlagSet, holding string) *string {
	return fs.String("state-dir", nodepaths.StateDir(""),
		"agent state directory holding "+holding+" (env "+nodepaths.StateDirEnv+")")
}

// SignalContext is a context that ends at SIGINT or SIGTERM, the way a
// binary is asked to stop; stop releases the signals.
func SignalContext() (ctx context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}
