package handler

import (
	"log/slog"
	"os"

	"github.com/go-logr/logr"
)

// NewLogger returns the logger handler binaries use: JSON lines on stderr,
// through log/slog, so that a handler needs no logging module beyond logr.
func NewLogger() logr.Logger {
	return logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, nil))
}
