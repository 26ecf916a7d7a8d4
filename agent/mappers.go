package agent

import (
	"context"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dowse-dev/dowse/internal/agent/dmi"
	"github.com/dowse-dev/dowse/internal/agent/edgehub"
)

// startMappers builds the node's mapper API (DMI on <state dir>/dmi.sock)
// on the edgehub's store; nil when it cannot (logged: the link keeps
// running without it).
func startMappers(cfg Config, hub *edgehub.EdgeHub, reg prometheus.Registerer, log logr.Logger) *dmi.Server {
	srv, err := dmi.New(dmi.Config{StateDir: cfg.StateDir, SocketGroup: cfg.socketGroup(), Node: cfg.NodeName}, hub, dmi.NewMetrics(reg))
	if err != nil {
		log.Error(err, "the mapper API is off")
		return nil
	}
	return srv
}

// runEdge runs the link (startLink: the hub's Start, once it can dial),
// and the mapper API when there is one, until ctx ends. The mapper API
// serves from the store at once, whether or not the link is up; it stops
// before the link does, so that no report meets a closed store. Its own
// failure (the socket cannot be served) is logged and leaves the link up.
func runEdge(ctx context.Context, mappers *dmi.Server, startLink func(context.Context) error) error {
	if mappers == nil {
		return startLink(ctx)
	}
	log := logr.FromContextOrDiscard(ctx)
	mctx, stopMappers := context.WithCancel(ctx)
	defer stopMappers()
	// The hub's context outlives ctx until the mapper API has stopped, so
	// that no report meets a closed store.
	hctx, stopHub := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHub()
	mdone := make(chan struct{})
	go func() {
		defer close(mdone)
		if err := mappers.Start(mctx); err != nil {
			log.Error(err, "the mapper API stopped")
		}
	}()
	go func() {
		<-ctx.Done()
		stopMappers()
		<-mdone
		stopHub()
	}()
	err := startLink(hctx)
	if err == nil && hctx.Err() == nil {
		// The link gave up without an error (credentials never came, or
		// were refused): the mapper API goes on until ctx ends.
		<-hctx.Done()
	}
	stopMappers()
	<-mdone
	return err
}
