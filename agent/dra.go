package agent

import (
	"errors"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/dowse-dev/dowse/internal/agent/cdi"
	"github.com/dowse-dev/dowse/internal/agent/dra"
)

// DRAConfig is the node's part of Dynamic Resource Allocation, for the
// Configurations whose spec.allocation is DRA or Both (internal/agent/dra).
type DRAConfig struct {
	// Enabled publishes this node's local devices as ResourceSlices,
	// writes the CDI specs of its DRA devices (into Config.CDISpecDir) and
	// serves the kubelet DRA plugin.
	Enabled bool
	// RegistrarDir is the kubelet's plugin registration directory (the
	// flags' default: dra.DefaultRegistrarDir); empty serves no kubelet plugin
	// (slices and CDI specs only).
	RegistrarDir string
	// PluginDir holds the plugin's socket and the checkpoint of prepared
	// claims (dra.DefaultPluginDir when empty).
	PluginDir string
}

func addDRA(mgr ctrl.Manager, restCfg *rest.Config, cfg Config, specs *cdi.Writer, reg prometheus.Registerer, log logr.Logger) error {
	if cfg.CDISpecDir == "" {
		return errors.New("DRA needs a CDI spec directory (--cdi-spec-dir)")
	}
	// Protobuf: ResourceSlices of a hundred devices are written often.
	protoCfg := rest.CopyConfig(restCfg)
	protoCfg.ContentType = runtime.ContentTypeProtobuf
	kube, err := kubernetes.NewForConfig(protoCfg)
	if err != nil {
		return err
	}
	meta, err := metadata.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	d, err := dra.New(mgr.GetCache(), kube, meta, dra.Options{
		NodeName: cfg.NodeName, RegistrarDir: cfg.DRA.RegistrarDir, PluginDir: cfg.DRA.PluginDir,
		CDIDir: cfg.CDISpecDir, CDI: specs, DevicePlugins: cfg.DevicePluginDir != "", Metrics: dra.NewMetrics(reg),
	}, log)
	if err != nil {
		return err
	}
	return mgr.Add(d)
}
