package dmi

import (
	"context"

	"github.com/dowse-dev/dowse/internal/agent/peercred"
)

// caller is who is at the other end of a connection to dmi.sock (see
// peercred): the zero caller, the agent's own process, is trusted.
type caller = peercred.Caller

var listenerOf = peercred.ListenerOf

func callerFrom(ctx context.Context) caller { return peercred.FromContext(ctx) }
