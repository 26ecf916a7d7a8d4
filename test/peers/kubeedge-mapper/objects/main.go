// Command objects prints KubeEdge DeviceModels, Devices and DeviceStatuses
// for Modbus, OPC UA and ONVIF devices as a YAML stream, built from the
// devices.kubeedge.io/v1beta1 Go types of KubeEdge's own API module (the
// contract `dowsectl convert` reads), in KubeEdge 1.23's shapes: the
// Device's spec.stateReport, a pushMethod's anomalyDetection, the model's
// protocolConfigData and visitors, the reported twins in a DeviceStatus of
// their own. Built with go.1.23.mod:
//
//	go run -modfile=go.1.23.mod ./objects
package main

import (
	"fmt"
	"os"

	devicesv1beta1 "github.com/kubeedge/api/apis/devices/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

func meta(kind, name string) (metav1.TypeMeta, metav1.ObjectMeta) {
	return metav1.TypeMeta{APIVersion: devicesv1beta1.SchemeGroupVersion.String(), Kind: kind},
		metav1.ObjectMeta{Name: name, Namespace: "default"}
}

func data(kv map[string]any) *devicesv1beta1.CustomizedValue {
	return &devicesv1beta1.CustomizedValue{Data: kv}
}

func model(name, protocol string, cfg map[string]any, props ...devicesv1beta1.ModelProperty) *devicesv1beta1.DeviceModel {
	m := &devicesv1beta1.DeviceModel{Spec: devicesv1beta1.DeviceModelSpec{Protocol: protocol, Properties: props}}
	m.TypeMeta, m.ObjectMeta = meta("DeviceModel", name)
	if cfg != nil {
		m.Spec.ProtocolConfigData = data(cfg)
	}
	return m
}

func device(name, modelName, protocol string, cfg map[string]any, props ...devicesv1beta1.DeviceProperty) *devicesv1beta1.Device {
	d := &devicesv1beta1.Device{Spec: devicesv1beta1.DeviceSpec{
		DeviceModelRef: &corev1.LocalObjectReference{Name: modelName},
		NodeName:       "edge-node",
		Protocol:       devicesv1beta1.ProtocolConfig{ProtocolName: protocol, ConfigData: data(cfg)},
		Properties:     props,
		StateReport:    &devicesv1beta1.StateReportConfig{ReportToCloud: true, ReportCycle: 10000},
	}}
	d.TypeMeta, d.ObjectMeta = meta("Device", name)
	return d
}

// status is the DeviceStatus KubeEdge 1.23's cloudcore keeps beside a
// Device (same name), with a reported twin.
func status(name, property, value string) *devicesv1beta1.DeviceStatus {
	s := &devicesv1beta1.DeviceStatus{Status: devicesv1beta1.DeviceStatusStatus{
		State: "ok",
		Twins: []devicesv1beta1.Twin{{PropertyName: property, Reported: devicesv1beta1.TwinProperty{Value: value, Metadata: map[string]string{"type": "string"}}}},
	}}
	s.TypeMeta, s.ObjectMeta = meta("DeviceStatus", name)
	return s
}

func objects() []runtime.Object {
	return []runtime.Object{
		model("modbus-plc", "modbus", map[string]any{"slaveID": 1},
			devicesv1beta1.ModelProperty{Name: "temperature", Type: devicesv1beta1.INT, AccessMode: devicesv1beta1.ReadOnly, Unit: "°C",
				Visitors: &devicesv1beta1.VisitorConfig{ProtocolName: "modbus", ConfigData: data(map[string]any{"register": "HoldingRegister", "offset": 2, "limit": 1})}},
			devicesv1beta1.ModelProperty{Name: "setpoint", Type: devicesv1beta1.INT, AccessMode: devicesv1beta1.ReadWrite, Minimum: "0", Maximum: "100"}),
		device("modbus-plc-1", "modbus-plc", "modbus", map[string]any{"ip": "192.168.1.20", "port": 502, "slaveID": 1},
			devicesv1beta1.DeviceProperty{Name: "temperature", ReportCycle: 1000, CollectCycle: 500, ReportToCloud: true,
				Visitors:   devicesv1beta1.VisitorConfig{ProtocolName: "modbus", ConfigData: data(map[string]any{"register": "HoldingRegister", "offset": 2, "limit": 1, "scale": 0.1})},
				PushMethod: &devicesv1beta1.PushMethod{AnomalyDetection: &devicesv1beta1.AnomalyDetectionConfig{Data: map[string]any{"model": "zscore", "threshold": 3}}}},
			devicesv1beta1.DeviceProperty{Name: "setpoint", Desired: devicesv1beta1.TwinProperty{Value: "30"}, ReportCycle: 1000, CollectCycle: 500, ReportToCloud: true,
				Visitors:   devicesv1beta1.VisitorConfig{ProtocolName: "modbus", ConfigData: data(map[string]any{"register": "HoldingRegister", "offset": 1, "limit": 1})},
				PushMethod: &devicesv1beta1.PushMethod{MQTT: &devicesv1beta1.PushMethodMQTT{Address: "tcp://mosquitto:1883", Topic: "plant/plc-1/setpoint", QoS: 1}}}),
		status("modbus-plc-1", "temperature", "21"),
		model("opcua-server", "opcua", nil,
			devicesv1beta1.ModelProperty{Name: "pressure", Type: devicesv1beta1.DOUBLE, AccessMode: devicesv1beta1.ReadOnly, Unit: "bar"}),
		device("opcua-server-1", "opcua-server", "opcua", map[string]any{"url": "opc.tcp://192.168.1.30:4840", "securityPolicy": "None", "securityMode": "None"},
			devicesv1beta1.DeviceProperty{Name: "pressure", ReportCycle: 2000, CollectCycle: 1000, ReportToCloud: true,
				Visitors: devicesv1beta1.VisitorConfig{ProtocolName: "opcua", ConfigData: data(map[string]any{"nodeID": "ns=2;s=Pressure"})},
				PushMethod: &devicesv1beta1.PushMethod{HTTP: &devicesv1beta1.PushMethodHTTP{HostName: "http://collector", Port: 8080, RequestPath: "/readings", Timeout: 1000},
					DBMethod: &devicesv1beta1.DBMethodConfig{Influxdb2: &devicesv1beta1.DBMethodInfluxdb2{
						Influxdb2ClientConfig: &devicesv1beta1.Influxdb2ClientConfig{URL: "http://influxdb:8086", Org: "plant", Bucket: "readings"},
						Influxdb2DataConfig:   &devicesv1beta1.Influxdb2DataConfig{Measurement: "pressure", FieldKey: "value", Tag: map[string]string{"line": "2"}}}}}}),
		status("opcua-server-1", "pressure", "1.2"),
		model("onvif-camera", "onvif", nil,
			devicesv1beta1.ModelProperty{Name: "saveFrame", Type: devicesv1beta1.STRING, AccessMode: devicesv1beta1.ReadWrite}),
		device("onvif-camera-1", "onvif-camera", "onvif", map[string]any{"url": "192.168.1.40:80", "userName": "admin", "password": "/etc/secret/password"},
			devicesv1beta1.DeviceProperty{Name: "saveFrame", ReportCycle: 10000, CollectCycle: 10000, ReportToCloud: true,
				Visitors: devicesv1beta1.VisitorConfig{ProtocolName: "onvif", ConfigData: data(map[string]any{"format": "jpg", "outputDir": "/tmp/frames", "frameCount": 30, "frameInterval": 1000000})}}),
	}
}

func main() {
	for _, o := range objects() {
		b, err := yaml.Marshal(o)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("---\n%s", b)
	}
}
