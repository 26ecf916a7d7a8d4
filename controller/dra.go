package controller

import (
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/dowse-dev/dowse/internal/controller/dra"
)

// addDRA adds the DeviceClasses and the shared devices' ResourceSlices,
// when the API server serves resource.k8s.io/v1 (Kubernetes 1.34 and
// later); without it the rest of the controller runs and DRA is off.
func addDRA(mgr ctrl.Manager, restCfg *rest.Config, reg prometheus.Registerer, log logr.Logger) error {
	if _, err := mgr.GetRESTMapper().RESTMapping(resourceapi.SchemeGroupVersion.WithKind("DeviceClass").GroupKind(), resourceapi.SchemeGroupVersion.Version); err != nil {
		if meta.IsNoMatchError(err) {
			log.Info("the API server does not serve resource.k8s.io/v1; dynamic resource allocation is off")
			return nil
		}
		return err
	}
	// Protobuf: thousands of slices may be written at once.
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
	if err := dra.NewClasses(mgr.GetClient(), log.WithName("classes")).SetupWithManager(mgr); err != nil {
		return err
	}
	return mgr.Add(dra.NewPublisher(mgr.GetCache(), kube, meta, dra.NewMetrics(reg), log.WithName("slices")))
}
