// Package controller wires dowse-controller: broker deployment, the
// Configurations' status and Services, and dead-node cleanup.
package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/dowse-dev/dowse/controller/broker"
	"github.com/dowse-dev/dowse/controller/nodes"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/scheme"
)

// Config is everything the controller needs; main fills it from flags.
type Config struct {
	Kubeconfig string
	RESTConfig *rest.Config // wins over Kubeconfig when set (tests)
	// LeaderElection makes only one replica act; LeaderElectionNamespace
	// holds its Lease.
	LeaderElection          bool
	LeaderElectionNamespace string
	// NodeGracePeriod is how long a node may be NotReady (or missing)
	// before it is removed from the Instances that name it.
	NodeGracePeriod         time.Duration
	MetricsAddr, HealthAddr string
	QPS                     float32
	Burst                   int
}

// Run runs the controller until ctx ends.
func Run(ctx context.Context, cfg Config, log logr.Logger) error {
	if cfg.NodeGracePeriod <= 0 {
		return errors.New("node grace period must be positive")
	}
	restCfg := cfg.RESTConfig
	if restCfg == nil {
		var err error
		if cfg.Kubeconfig != "" {
			restCfg, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		} else {
			restCfg, err = rest.InClusterConfig()
		}
		if err != nil {
			return fmt.Errorf("loading kubeconfig: %w", err)
		}
	}
	restCfg = rest.CopyConfig(restCfg)
	if cfg.QPS != 0 {
		restCfg.QPS, restCfg.Burst = cfg.QPS, cfg.Burst
	}
	restCfg.UserAgent = "dowse-controller"
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  sch,
		Logger:                  log,
		Cache:                   cache.Options{DefaultTransform: cache.TransformStripManagedFields()},
		Metrics:                 metricsserver.Options{BindAddress: orZero(cfg.MetricsAddr)},
		HealthProbeBindAddress:  orZero(cfg.HealthAddr),
		LeaderElection:          cfg.LeaderElection,
		LeaderElectionID:        "dowse-controller.dowse.dev",
		LeaderElectionNamespace: cfg.LeaderElectionNamespace,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Instance{}, broker.ConfigurationIndex, func(o client.Object) []string {
		return []string{o.(*v1alpha1.Instance).Spec.ConfigurationName}
	}); err != nil {
		return err
	}
	errs := broker.NewErrors()
	if err := broker.NewInstanceReconciler(mgr.GetClient(), mgr.GetEventRecorder("dowse-controller"), errs, log.WithName("broker")).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := broker.NewConfigurationReconciler(mgr.GetClient(), errs).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := nodes.NewReconciler(mgr.GetClient(), cfg.NodeGracePeriod, log.WithName("nodes")).SetupWithManager(mgr); err != nil {
		return err
	}
	log.Info("starting controller")
	return mgr.Start(ctx)
}

func orZero(addr string) string {
	if addr == "" {
		return "0"
	}
	return addr
}
