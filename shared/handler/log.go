package handler

import (
	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/internal/command"
)

// NewLogger returns the logger handler binaries use: JSON lines on stderr,
// through log/slog, so that a handler needs no logging module beyond logr.
func NewLogger() logr.Logger { return command.NewLogger() }

// TuneGC makes a handler process collect garbage at 50% heap growth instead
// of Go's 100%, unless GOGC is set: on an edge node a handler's memory is
// scarcer than the little CPU this costs. Call it first thing in main; it
// changes the whole process.
func TuneGC() { command.TuneGC(50) }
