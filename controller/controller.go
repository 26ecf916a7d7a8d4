// Package controller wires dowse-controller. On the leader: broker Pods,
// Jobs and Services, the Configurations' status, Devices made from
// Instances and their validity, mapper Pods, DRA publishing, and dead-node
// cleanup. On every replica, with the cloud/edge link on: the cloud hub,
// the link's credentials, and the twin sync and Device status writes of the
// nodes whose sessions the replica holds.
package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes"
	eventsclient "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/dowse-dev/dowse/internal/apiready"
	"github.com/dowse-dev/dowse/internal/controller/brokers"
	"github.com/dowse-dev/dowse/internal/controller/devices"
	"github.com/dowse-dev/dowse/internal/controller/lifecycle"
	"github.com/dowse-dev/dowse/internal/controller/mappers"
	"github.com/dowse-dev/dowse/internal/controller/nodes"
	"github.com/dowse-dev/dowse/internal/controller/propertyaccess"
	"github.com/dowse-dev/dowse/internal/events"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/optional"
	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Config is everything the controller needs; main fills it from flags
// (AddFlags). Run gives a zero field the default the binary has (see
// setDefaults), so a test runs the controller the binary runs. Switches
// whose zero value is off (LeaderElection, DRA, AgentServiceAccounts, the
// link's Hosts, addresses and AgentServiceAccounts) keep that meaning; the
// flags turn leader election, DRA and the dowse-agent accounts on.
type Config struct {
	// Client is the API client's kubeconfig and rate limits (200 requests
	// a second, burst 400). RESTConfig, when set, wins over the kubeconfig
	// (tests use it).
	Client     kubeflags.Client
	RESTConfig *rest.Config
	// LeaderElection makes only one replica act; LeaderElectionNamespace
	// holds its Lease (dowse-system).
	LeaderElection          bool
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod time leader election
	// (2m, 100s, 5s). A leader that cannot renew within RenewDeadline
	// stops, and so does its process, with every edge's session it holds:
	// long enough to ride out an API server that restarts or is away a
	// minute. A replica told to stop hands over at once; one killed is
	// replaced after LeaseDuration.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// NodeGracePeriod is how long a node may be NotReady (or missing)
	// before it is removed from the Instances that name it (5m).
	NodeGracePeriod time.Duration
	// Serving is the metrics (:9745), health (:9746) and profiling (off)
	// addresses.
	Serving kubeflags.Serving
	// Namespace is the controller's own: the link CA and bootstrap tokens
	// live there (dowse-system).
	Namespace string
	// Link is the cloud end of the cloud/edge link (off when its Hosts is
	// empty).
	Link LinkConfig
	// PodName is this replica's Pod (in Namespace): its identity among the
	// replicas (Link.Replica) and as the leader election Lease's holder
	// when set.
	PodName string
	// MapperStateDir is the agents' state directory on the nodes, mounted
	// into mapper Pods (mappers.DefaultStateDir when empty).
	MapperStateDir string
	// MapperSocketGroup owns the agents' socket folders: the mapper Pods
	// the controller runs get it as a supplemental group (0: none).
	MapperSocketGroup int64
	// Registerer receives the link's metrics; nil means the manager's
	// metrics registry (served on MetricsAddr).
	Registerer prometheus.Registerer
	// AgentServiceAccounts are the agents' service accounts
	// ("namespace/name"), granted read of exactly the Secrets and
	// ConfigMaps that discoveryProperties name (internal/controller/propertyaccess);
	// empty: the controller grants nothing.
	AgentServiceAccounts []string
	// PropertyNamespaces are the namespaces, besides its own, whose Secrets
	// and ConfigMaps any Configuration's discoveryProperties may read.
	PropertyNamespaces []string
	// ConfigurationNamespaces, when set, are the namespaces Configurations
	// are served in for property access: the controller then may hold read
	// of Secrets and ConfigMaps only there and in PropertyNamespaces.
	ConfigurationNamespaces []string
	// DRA runs the Dynamic Resource Allocation part (internal/controller/dra): a
	// DeviceClass per Configuration whose spec.allocation asks for DRA and
	// the ResourceSlices of their shared devices. Off when false (tests
	// that do not need it); on an API server without resource.k8s.io/v1 it
	// is logged and left off.
	DRA bool
	// AgentPodSelector selects the agent DaemonSet's Pods in Namespace; set,
	// the controller drops the Configuration finalizers of an agent that has
	// had no Pod on its node for NodeGracePeriod (internal/controller/lifecycle).
	// Empty (agents not run as Pods): off.
	AgentPodSelector string
	// SkipNameValidation lets one process run several of these managers,
	// as tests do; otherwise controller names must be unique in a process,
	// because their metrics are labelled by name. Only tests set it.
	SkipNameValidation bool
}

// Run runs the controller until ctx ends.
func Run(ctx context.Context, cfg Config, log logr.Logger) error {
	cfg.setDefaults()
	if cfg.NodeGracePeriod < 0 {
		return errors.New("node grace period must be positive")
	}
	if n := cfg.Link.MaxStreamsPerNode; n < 0 || n > link.DefaultMaxStreams {
		return fmt.Errorf("--max-streams-per-node %d: from 1 to %d (what an edge serves)", n, link.DefaultMaxStreams)
	}
	restCfg, err := cfg.Client.Load(cfg.RESTConfig, "dowse-controller")
	if err != nil {
		return err
	}
	apiready.HoldRequests(restCfg, time.Second, log.WithName("api"))
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	if err := apiready.Await(ctx, restCfg, sch, v1alpha1.GroupVersion, log.WithName("api")); err != nil {
		return err
	}
	mgr, err := newManager(restCfg, sch, cfg, log)
	if err != nil {
		return err
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = ctrlmetrics.Registry
	}
	evClient, err := eventsclient.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	recorder := events.New(evClient, sch, "dowse-controller", "dowse_controller", 1000, reg)
	if err := mgr.Add(recorder); err != nil {
		return err
	}
	if err := addWorkloads(ctx, mgr, cfg, recorder, reg, log); err != nil {
		return err
	}
	if err := addNodeParts(ctx, mgr, cfg, reg, log); err != nil {
		return err
	}
	if cfg.DRA {
		if err := addDRA(mgr, restCfg, reg, log.WithName("dra")); err != nil {
			return fmt.Errorf("setting up dynamic resource allocation: %w", err)
		}
	}
	if len(cfg.Link.Hosts) > 0 {
		if cfg.Link.Replica == "" {
			cfg.Link.Replica = replicaName(cfg.PodName)
		}
		if err := addLink(ctx, mgr, cfg, reg, log.WithName("link")); err != nil {
			return fmt.Errorf("setting up the cloud/edge link: %w", err)
		}
	}
	log.Info("starting controller")
	return mgr.Start(ctx)
}

// newManager makes the controller's manager: a cache of only what the
// controller made or reads (brokers' Pods, Jobs and Services by label,
// slimmed Nodes and Instances, its own property grants), leader election,
// and the health checks.
func newManager(restCfg *rest.Config, sch *runtime.Scheme, cfg Config, log logr.Logger) (ctrl.Manager, error) {
	req, err := labels.NewRequirement(v1alpha1.LabelConfiguration, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	ours := labels.NewSelector().Add(*req)
	cacheScheme, err := brokers.CacheScheme(sch)
	if err != nil {
		return nil, err
	}
	var lock resourcelock.Interface
	if cfg.LeaderElection && cfg.PodName != "" {
		if lock, err = podLeaderLock(restCfg, cfg); err != nil {
			return nil, err
		}
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:     sch,
		Logger:     log,
		Controller: config.Controller{SkipNameValidation: ptr.To(cfg.SkipNameValidation)},
		// The cache reads JSON: it decodes Pods into brokers.BrokerPod,
		// which protobuf cannot.
		NewCache: func(config *rest.Config, opts cache.Options) (cache.Cache, error) {
			config = rest.CopyConfig(config)
			config.ContentType = runtime.ContentTypeJSON
			return cache.New(config, opts)
		},
		Cache: cache.Options{
			Scheme:           cacheScheme,
			DefaultTransform: cache.TransformStripManagedFields(),
			// Only what the controller made: caching every Pod of a large
			// cluster would cost more than the Instances themselves.
			ByObject: map[client.Object]cache.ByObject{
				&brokers.BrokerPod{}: {Label: ours},
				&batchv1.Job{}:       {Label: ours, Transform: slimJob},
				&corev1.Service{}:    {Label: ours},
				// Read only, and often (one Get per broker): no copies.
				&corev1.Node{}:       {Transform: slimNode, UnsafeDisableDeepCopy: ptr.To(true)},
				&v1alpha1.Instance{}: {Transform: slimInstance},
				// Only the grants internal/controller/propertyaccess keeps.
				&rbacv1.Role{}:        {Label: propertyaccess.Managed},
				&rbacv1.RoleBinding{}: {Label: propertyaccess.Managed},
			},
		},
		Metrics:                metricsserver.Options{BindAddress: cfg.Serving.MetricsAddr},
		HealthProbeBindAddress: cfg.Serving.HealthAddr,
		PprofBindAddress:       cfg.Serving.PprofAddr,
		LeaderElection:         cfg.LeaderElection,
		LeaderElectionID:       leaderElectionID,
		// nil (controller-runtime's own, identified by the host name and a
		// random id) outside a Pod.
		LeaderElectionResourceLockInterface: lock,
		LeaderElectionNamespace:             cfg.LeaderElectionNamespace,
		// A replica told to stop (its Pod deleted, a rolling update) hands
		// the lease over at once instead of making the next leader wait
		// out the lease (15 s). Run returns and main exits when the
		// manager stops, as this needs.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &cfg.LeaseDuration,
		RenewDeadline:                 &cfg.RenewDeadline,
		RetryPeriod:                   &cfg.RetryPeriod,
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("cache-sync", optional.CacheSynced(mgr.GetCache())); err != nil {
		return nil, err
	}
	return mgr, nil
}

// addWorkloads adds what runs next to devices: brokers (Pods, Jobs,
// Services) from Configurations' brokerSpec, Devices from Instances, and
// mapper Pods from deviceTemplates.
func addWorkloads(ctx context.Context, mgr ctrl.Manager, cfg Config, recorder *events.Recorder, reg prometheus.Registerer, log logr.Logger) error {
	idx, err := brokers.NewIndexes(ctx, mgr.GetCache())
	if err != nil {
		return err
	}
	refusals := brokers.NewRefusals()
	if err := brokers.NewInstanceReconciler(mgr.GetClient(), idx, recorder, refusals, log.WithName("broker")).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := brokers.NewConfigurationReconciler(mgr.GetClient(), idx, refusals).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := brokers.NewSlotsReconciler(mgr.GetClient()).SetupWithManager(mgr); err != nil {
		return err
	}
	instancesOf := func(namespace, configuration string) ([]string, error) {
		objs, err := idx.InstancesByConfiguration.Objects(namespace, configuration)
		names := make([]string, len(objs))
		for i, o := range objs {
			names[i] = o.GetName()
		}
		return names, err
	}
	if err := devices.NewProvisioner(mgr.GetClient(), mgr.GetAPIReader(), instancesOf, recorder, reg, log.WithName("devices")).SetupWithManager(mgr); err != nil {
		return err
	}
	podsOf := func(namespace, configurationLabel string) ([]client.Object, error) {
		return idx.PodsByConfiguration.Objects(namespace, configurationLabel)
	}
	if err := mappers.NewReconciler(mgr.GetClient(), podsOf, cfg.MapperStateDir, cfg.MapperSocketGroup, log.WithName("mappers")).SetupWithManager(mgr, &brokers.BrokerPod{}); err != nil {
		return err
	}
	return nil
}

// addNodeParts adds what follows nodes and agents: dead-node cleanup, the
// twin gauge, the janitor of agents' finalizers, and the agents' read of
// the Secrets and ConfigMaps that discoveryProperties name.
func addNodeParts(ctx context.Context, mgr ctrl.Manager, cfg Config, reg prometheus.Registerer, log logr.Logger) error {
	if err := nodes.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), cfg.NodeGracePeriod, log.WithName("nodes")).SetupWithManager(mgr); err != nil {
		return err
	}
	// Several controllers in one process (tests) share a registry: the
	// first one's gauge counts.
	if err := reg.Register(lifecycle.NewTwinGauge(mgr.GetCache())); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		return err
	}
	if cfg.AgentPodSelector != "" {
		sel, err := labels.Parse(cfg.AgentPodSelector)
		if err != nil {
			return fmt.Errorf("agent pod selector %q: %w", cfg.AgentPodSelector, err)
		}
		if err := mgr.Add(&lifecycle.AgentJanitor{Client: mgr.GetClient(), GracePeriod: cfg.NodeGracePeriod, Log: log.WithName("agent-janitor"),
			Agents: lifecycle.Agents{Reader: mgr.GetAPIReader(), Namespace: cfg.Namespace, Selector: sel}}); err != nil {
			return err
		}
	}
	if len(cfg.AgentServiceAccounts) > 0 {
		agents, err := propertyaccess.ParseServiceAccounts(cfg.AgentServiceAccounts, cfg.Namespace)
		if err != nil {
			return err
		}
		access, err := propertyaccess.NewReconciler(mgr.GetClient(), agents, cfg.PropertyNamespaces, cfg.ConfigurationNamespaces, log.WithName("property-access"))
		if err != nil {
			return err
		}
		if err := access.SetupWithManager(ctx, mgr); err != nil {
			return err
		}
	}
	return nil
}

// replicaName is the Pod's name, or outside a Pod the host's with a random
// suffix (several processes on one host are several replicas).
const leaderElectionID = "dowse-controller.dowse.dev"

// podLeaderLock is the leader election Lease held under the replica's Pod
// name rather than controller-runtime's host name and random id: a
// container killed (-9, out of memory) and restarted in its Pod takes its
// own Lease back at once, instead of every replica waiting out the lease
// duration (2 minutes by default) for a holder that is gone. A Pod's name
// is unique while it lives, as an identity must be.
func podLeaderLock(restCfg *rest.Config, cfg Config) (resourcelock.Interface, error) {
	c := rest.AddUserAgent(rest.CopyConfig(restCfg), "leader-election")
	// As controller-runtime's: one hung request must not outlast the
	// renew deadline.
	c.Timeout = max(cfg.RenewDeadline/2, time.Second)
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, err
	}
	return resourcelock.New(resourcelock.LeasesResourceLock, cfg.LeaderElectionNamespace, leaderElectionID,
		cs.CoreV1(), cs.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: cfg.PodName})
}

func replicaName(pod string) string {
	if pod != "" {
		return pod
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%06x", cmp.Or(host, "dowse-controller"), rand.Uint32()&0xffffff)
}

// slimNode keeps what the controller reads of a Node: its name, deletion,
// conditions and addresses (the egress finds a node by its address); a
// Node's image list alone can be kilobytes.
func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	n.ManagedFields, n.Annotations = nil, nil
	n.Spec = corev1.NodeSpec{}
	n.Status = corev1.NodeStatus{Conditions: n.Status.Conditions, Addresses: n.Status.Addresses}
	return n, nil
}

// slimInstance keeps what the controller reads of an Instance: its
// Configuration and the nodes that see it (and, for a shared device, what
// internal/controller/dra publishes of it). Whatever writes an Instance reads
// it from the API server first (nodes.Reconciler).
func slimInstance(obj any) (any, error) {
	i, ok := obj.(*v1alpha1.Instance)
	if !ok {
		return obj, nil
	}
	i.ManagedFields, i.Annotations = nil, nil
	// Device nodes and mounts stay (a path or two): a mapper Pod asks for
	// the device of an Instance that has them (internal/controller/mappers).
	spec := v1alpha1.InstanceSpec{ConfigurationName: i.Spec.ConfigurationName, Shared: i.Spec.Shared,
		DeviceSpecs: i.Spec.DeviceSpecs, Mounts: i.Spec.Mounts}
	if i.Spec.Shared {
		// internal/controller/dra publishes shared devices with their properties
		// and capacity.
		spec.Capacity, spec.BrokerProperties = i.Spec.Capacity, i.Spec.BrokerProperties
	}
	i.Spec = spec
	i.Status.Slots = brokers.SlimSlots(i)
	return i, nil
}

// slimJob keeps a Job's metadata: the controller only names and deletes them.
func slimJob(obj any) (any, error) {
	j, ok := obj.(*batchv1.Job)
	if !ok {
		return obj, nil
	}
	j.ManagedFields = nil
	j.Spec = batchv1.JobSpec{}
	j.Status = batchv1.JobStatus{}
	return j, nil
}
