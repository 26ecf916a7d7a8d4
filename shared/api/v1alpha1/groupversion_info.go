// Package v1alpha1 holds the dowse.dev/v1alpha1 API: Configuration, Instance,
// DeviceModel and Device.
// +kubebuilder:object:generate=true
// +groupName=dowse.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of every kind in this package.
var GroupVersion = schema.GroupVersion{Group: "dowse.dev", Version: "v1alpha1"}

// AddToScheme registers this package's kinds with a scheme. It is built
// without controller-runtime so that light binaries can use these types.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&Configuration{}, &ConfigurationList{},
		&Instance{}, &InstanceList{},
		&DeviceModel{}, &DeviceModelList{},
		&Device{}, &DeviceList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
