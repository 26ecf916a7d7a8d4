package controller

import (
	"context"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	cloudlink "github.com/dowse-dev/dowse/internal/controller/link"
)

// LinkConfig is the cloud end of the cloud/edge link (package
// internal/controller/link); the link is off when Hosts is empty.
type LinkConfig = cloudlink.Config

// addLink adds the link to mgr, its CA and Leases in the controller's
// namespace.
func addLink(ctx context.Context, mgr ctrl.Manager, cfg Config, reg prometheus.Registerer, log logr.Logger) error {
	lc := cfg.Link
	lc.Namespace = cfg.Namespace
	return cloudlink.Add(ctx, mgr, lc, reg, log)
}
