package dmiv1beta1_test

import (
	"testing"

	// Linked on purpose: the agent links both, and a proto full name
	// registered twice panics at start (the kubelet's package is v1beta1).
	_ "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
)

// TestServiceNamesAreKubeEdges: the gRPC paths are what KubeEdge's mappers
// and edgecore call, whatever package the messages are in.
func TestServiceNamesAreKubeEdges(t *testing.T) {
	for got, want := range map[string]string{
		dmiv1beta1.DeviceManagerService_MapperRegister_FullMethodName:     "/v1beta1.DeviceManagerService/MapperRegister",
		dmiv1beta1.DeviceManagerService_ReportDeviceStatus_FullMethodName: "/v1beta1.DeviceManagerService/ReportDeviceStatus",
		dmiv1beta1.DeviceManagerService_ReportDeviceStates_FullMethodName: "/v1beta1.DeviceManagerService/ReportDeviceStates",
		dmiv1beta1.DeviceMapperService_RegisterDevice_FullMethodName:      "/v1beta1.DeviceMapperService/RegisterDevice",
		dmiv1beta1.DeviceMapperService_UpdateDevice_FullMethodName:        "/v1beta1.DeviceMapperService/UpdateDevice",
		dmiv1beta1.DeviceMapperService_RemoveDevice_FullMethodName:        "/v1beta1.DeviceMapperService/RemoveDevice",
		dmiv1beta1.DeviceMapperService_CreateDeviceModel_FullMethodName:   "/v1beta1.DeviceMapperService/CreateDeviceModel",
		dmiv1beta1.DeviceMapperService_UpdateDeviceModel_FullMethodName:   "/v1beta1.DeviceMapperService/UpdateDeviceModel",
		dmiv1beta1.DeviceMapperService_RemoveDeviceModel_FullMethodName:   "/v1beta1.DeviceMapperService/RemoveDeviceModel",
		dmiv1beta1.DeviceMapperService_GetDevice_FullMethodName:           "/v1beta1.DeviceMapperService/GetDevice",
	} {
		if got != want {
			t.Errorf("method %s, want KubeEdge's %s", got, want)
		}
	}
}
