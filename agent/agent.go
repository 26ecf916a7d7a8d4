// Package agent wires the per-node Dowse agent: the discovery handlers'
// registration server and registry, the Configuration reconciler and
// Instance writer, device plugins and CDI specs or the DRA driver, and, with
// the cloud/edge link on, the edge hub and its store with the mapper API
// (DMI) that the node's twins go through.
package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes"
	eventsclient "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/dowse-dev/dowse/internal/agent/cdi"
	"github.com/dowse-dev/dowse/internal/agent/deviceplugin"
	"github.com/dowse-dev/dowse/internal/agent/discovery"
	"github.com/dowse-dev/dowse/internal/agent/instances"
	"github.com/dowse-dev/dowse/internal/agent/propertyrefs"
	"github.com/dowse-dev/dowse/internal/agent/registration"
	"github.com/dowse-dev/dowse/internal/agent/registry"
	"github.com/dowse-dev/dowse/internal/apiready"
	"github.com/dowse-dev/dowse/internal/events"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/internal/optional"
	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Config is everything the agent needs; main fills it from flags
// (AddFlags). Run gives a zero field the default the binary has (see
// setDefaults), so a test runs the agent the binary runs. Fields whose zero
// value turns a part off (DevicePluginDir, DRA, Link) keep that meaning;
// the flags default DevicePluginDir to the kubelet's.
type Config struct {
	// Client is the API client's kubeconfig and rate limits (1000 requests
	// a second, burst 2000: discovery bursts of thousands of devices need
	// far more than client-go's 5). RESTConfig, when set, wins over the
	// kubeconfig (tests use it).
	Client     kubeflags.Client
	RESTConfig *rest.Config
	// NodeAPI, when set, is the node API proxy's address (`dowse-agent
	// node-api`): the agent reaches the API server through it, with its own
	// token, so that it starts and reads its objects while the API server
	// cannot be reached. NodeAPICA is the proxy's serving CA.
	NodeAPI   string
	NodeAPICA string
	NodeName  string
	// StateDir is the agent's own (/var/lib/dowse): its link credentials
	// and edge store, and the socket folders it shares with handlers
	// (discovery/) and mappers (dmi/).
	StateDir string
	// SocketGroup owns the socket folders and the agent's sockets in them,
	// for handlers and mappers that run as non-root users in it; 0: the
	// agent's own group.
	SocketGroup int
	// HostPaths are the host paths handlers may hand out as device nodes
	// and mounts (discovery.DefaultHostPaths: under /dev).
	HostPaths discovery.HostPaths
	// Namespace limits the agent to one namespace; empty watches all.
	Namespace string
	// GracePeriod is how long a vanished handler's devices stay (5m;
	// negative: none).
	GracePeriod time.Duration
	// MaxDevices caps one handler list (10,000; negative: no cap).
	MaxDevices int
	// WriteConcurrency bounds parallel Instance writes (64).
	WriteConcurrency int
	// Serving is the metrics (:9743), health (:9744) and profiling (off)
	// addresses.
	Serving kubeflags.Serving
	// DevicePluginDir is the kubelet's device-plugin directory; empty
	// disables device plugins and CDI specs (the in-process integration
	// tests run several agents and no kubelet).
	DevicePluginDir string
	// CDISpecDir is where the agent writes a CDI spec per Instance
	// (/var/run/cdi).
	CDISpecDir string
	// ClassicAllocate makes Allocate answer with env, mounts and device
	// nodes instead of CDI device names, for runtimes without CDI.
	ClassicAllocate bool
	// SlotReclaimGrace is how long a slot this node holds may go unused by
	// any pod (per the kubelet's pod-resources API) before it is freed (1m;
	// negative disables the reclaimer).
	SlotReclaimGrace time.Duration
	// PodResourcesSocket is the kubelet's pod-resources API socket the
	// reclaimer lists pods' devices with (deviceplugin's default when empty).
	PodResourcesSocket string
	// SlotReclaimInterval is the time between reclaimer scans (10s when 0).
	SlotReclaimInterval time.Duration
	// Registerer receives the agent's own metrics; nil means the manager's
	// metrics registry (served on MetricsAddr).
	Registerer prometheus.Registerer
	// Link is the node's end of the cloud/edge link (off when its Server
	// is empty).
	Link LinkConfig
	// DRA is the node's part of Dynamic Resource Allocation (off when its
	// Enabled is false).
	DRA DRAConfig
	// SkipNameValidation lets one process run several of these managers,
	// as tests do; otherwise controller names must be unique in a process,
	// because their metrics are labelled by name. Only tests set it.
	SkipNameValidation bool
}

// Validate says what is wrong with c.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name is required (--node-name or NODE_NAME)"))
	}
	if c.NodeAPI != "" && c.NodeAPICA == "" {
		errs = append(errs, errors.New("--node-api needs --node-api-ca, the proxy's serving CA"))
	}
	if c.WriteConcurrency < 0 {
		errs = append(errs, errors.New("write concurrency must not be negative"))
	}
	return errors.Join(errs...)
}

// Scheme returns a scheme with the Kubernetes and Dowse types.
func Scheme() (*runtime.Scheme, error) { return scheme.New() }

// Run runs the agent until ctx ends: a manager caching the node's own
// objects, then its parts in the order they depend on each other
// (discovery writes the Instances the device plugins and DRA serve,
// registration admits the handlers discovery talks to), then the link.
func Run(ctx context.Context, cfg Config, log logr.Logger) error {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	restCfg, err := cfg.Client.Load(cfg.RESTConfig, "dowse-agent/"+cfg.NodeName)
	if err != nil {
		return err
	}
	if cfg.NodeAPI != "" {
		restCfg = throughNodeAPI(restCfg, cfg.NodeAPI, cfg.NodeAPICA)
	}
	// A fleet's agents come back over a few seconds, not in one.
	apiready.HoldListsAndWatches(restCfg, 5*time.Second, log.WithName("api"))
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	if err := apiready.Await(ctx, restCfg, sch, v1alpha1.GroupVersion, log.WithName("api")); err != nil {
		return err
	}
	mgr, err := newManager(ctx, restCfg, sch, cfg, log)
	if err != nil {
		return err
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = ctrlMetricsRegistry()
	}
	handlers := registry.New(cfg.StateDir)
	// What containers get of the host comes from this node's own handlers
	// (cdi.Local), not from shared Instance objects other nodes also write.
	local := cdi.NewLocal()
	if err := addDiscovery(ctx, mgr, restCfg, sch, cfg, handlers, local, reg, log); err != nil {
		return err
	}
	if err := addDeviceAllocation(mgr, restCfg, cfg, local, reg, log); err != nil {
		return err
	}
	if err := addRegistration(mgr, cfg, handlers, log); err != nil {
		return err
	}
	if cfg.Link.Server != "" {
		if err := addLink(mgr, cfg, reg, log); err != nil {
			return fmt.Errorf("setting up the cloud/edge link: %w", err)
		}
	}
	log.Info("starting agent", "node", cfg.NodeName, "stateDir", cfg.StateDir)
	return mgr.Start(ctx)
}

// newManager is the agent's controller-runtime manager, its cache holding
// only what the agent reads, with its health checks and the Instance index.
func newManager(ctx context.Context, restCfg *rest.Config, sch *runtime.Scheme, cfg Config, log logr.Logger) (ctrl.Manager, error) {
	// managedFields are most of an applied object's size and the agent never
	// reads them: dropping them from the cache roughly halves its memory.
	// The cache holds no Secret or ConfigMap: the agent may not list them,
	// and reads the few that discoveryProperties name one by one
	// (internal/agent/propertyrefs).
	cacheOpts := cache.Options{DefaultTransform: cache.TransformStripManagedFields()}
	// The agent caches only its own node's Instances (those with its node
	// label), so its memory and watch traffic do not grow with other nodes'.
	ownNode, err := labels.NewRequirement(v1alpha1.NodeLabel(cfg.NodeName), selection.Exists, nil)
	if err != nil {
		return nil, fmt.Errorf("node %q makes no label selector: %w", cfg.NodeName, err)
	}
	cacheOpts.ByObject = map[client.Object]cache.ByObject{
		&v1alpha1.Instance{}: {Label: labels.NewSelector().Add(*ownNode), Transform: instances.Trim},
	}
	if cfg.Namespace != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{cfg.Namespace: {}}
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 sch,
		Logger:                 log,
		Cache:                  cacheOpts,
		Metrics:                metricsserver.Options{BindAddress: cfg.Serving.MetricsAddr},
		HealthProbeBindAddress: cfg.Serving.HealthAddr,
		PprofBindAddress:       cfg.Serving.PprofAddr,
		// One agent per node, each with its own field manager: nothing to elect.
		LeaderElection: false,
		Controller:     config.Controller{SkipNameValidation: ptr.To(cfg.SkipNameValidation)},
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
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Instance{}, instances.ConfigurationIndex, instances.IndexByConfiguration); err != nil {
		return nil, err
	}

	return mgr, nil
}

// addDiscovery adds what turns handlers' device lists into Instances: the
// Instance writer fed by the cache, the labeler of older Instances, the
// Events recorder and the Configuration reconciler.
func addDiscovery(ctx context.Context, mgr ctrl.Manager, restCfg *rest.Config, sch *runtime.Scheme, cfg Config, handlers *registry.Registry, local *cdi.Local, reg prometheus.Registerer, log logr.Logger) error {
	writer := instances.NewWriter(mgr.GetClient(), mgr.GetAPIReader(), cfg.NodeName, cfg.WriteConcurrency, instances.NewMetrics(reg), local)
	instInformer, err := mgr.GetCache().GetInformer(ctx, &v1alpha1.Instance{})
	if err != nil {
		return err
	}
	if _, err := instInformer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    writer.Observe,
		UpdateFunc: func(_, obj any) { writer.Observe(obj) },
	}); err != nil {
		return err
	}
	// Instances written before the node label existed are outside the
	// cache until they have it.
	if err := mgr.Add(&instances.Labeler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Node: cfg.NodeName,
		StateDir: cfg.StateDir, Namespace: cfg.Namespace, Log: log.WithName("labeler")}); err != nil {
		return err
	}
	propCfg := rest.CopyConfig(restCfg)
	propCfg.ContentType = runtime.ContentTypeProtobuf
	props, err := kubernetes.NewForConfig(propCfg)
	if err != nil {
		return err
	}
	evClient, err := eventsclient.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	// Events say why candidates were skipped; best effort, dropped when
	// the API server is slower than the agent.
	recorder := events.New(evClient, sch, "dowse-agent", "dowse_agent", 100, reg)
	if err := mgr.Add(recorder); err != nil {
		return err
	}
	rec := discovery.NewReconciler(mgr.GetClient(), props, handlers, writer, discovery.Options{
		NodeName: cfg.NodeName, GracePeriod: max(cfg.GracePeriod, 0), MaxDevices: max(cfg.MaxDevices, 0), HostPaths: cfg.HostPaths,
		PropertyMetrics: propertyrefs.NewMetrics(reg), Metrics: discovery.NewMetrics(reg), Recorder: recorder,
	}, log.WithName("discovery"))
	if err := rec.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up configuration controller: %w", err)
	}
	return nil
}

// addDeviceAllocation adds what gives pods the node's devices: the kubelet
// device plugins and DRA driver that are on, sharing one CDI writer.
func addDeviceAllocation(mgr ctrl.Manager, restCfg *rest.Config, cfg Config, local *cdi.Local, reg prometheus.Registerer, log logr.Logger) error {
	var err error
	// One CDI writer for the device plugins and DRA: a legacy spec either
	// keeps stays until both let go of it.
	var specs *cdi.Writer
	if cfg.CDISpecDir != "" && (cfg.DevicePluginDir != "" || cfg.DRA.Enabled) {
		if specs, err = cdi.NewWriter(cfg.CDISpecDir, local); err != nil {
			return err
		}
	}
	if cfg.DevicePluginDir != "" {
		plugins, err := deviceplugin.NewManager(mgr.GetClient(), deviceplugin.Options{
			NodeName: cfg.NodeName, PluginDir: cfg.DevicePluginDir, CDIDir: cfg.CDISpecDir, CDI: specs, Classic: cfg.ClassicAllocate,
			ReclaimGrace: max(cfg.SlotReclaimGrace, 0), ReclaimInterval: cfg.SlotReclaimInterval,
			PodResourcesSocket: cfg.PodResourcesSocket, Metrics: deviceplugin.NewMetrics(reg),
		}, log.WithName("deviceplugin"))
		if err != nil {
			return err
		}
		if err := plugins.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up device plugins: %w", err)
		}
	}
	if cfg.DRA.Enabled {
		if err := addDRA(mgr, restCfg, cfg, specs, reg, log.WithName("dra")); err != nil {
			return fmt.Errorf("setting up dynamic resource allocation: %w", err)
		}
	}
	return nil
}

// addRegistration serves the registration socket handlers register on,
// and checks it.
func addRegistration(mgr ctrl.Manager, cfg Config, handlers *registry.Registry, log logr.Logger) error {
	regSrv := registration.New(cfg.StateDir, cfg.socketGroup(), handlers, log.WithName("registration"))
	if err := mgr.Add(regSrv); err != nil {
		return err
	}
	// Handlers can register once the socket is served; a socket that stops
	// answering (wedged, or removed under the agent) needs a restart.
	if err := mgr.AddReadyzCheck("registration", regSrv.Ready); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("registration", regSrv.Healthy); err != nil {
		return err
	}
	return nil
}
