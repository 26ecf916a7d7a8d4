package twins

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

func js(s string) *apiextensionsv1.JSON { return &apiextensionsv1.JSON{Raw: []byte(s)} }

// TestEdgeDevice: the model fills in the protocol, default configData
// (the Device's keys win) and default visitors; cycles become
// milliseconds; reportToCloud defaults to true.
func TestEdgeDevice(t *testing.T) {
	model := &v1alpha1.DeviceModel{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", Generation: 3},
		Spec: v1alpha1.DeviceModelSpec{Protocol: "modbus", ProtocolConfigData: js(`{"timeout":"1s","unitId":1}`),
			Properties: []v1alpha1.ModelProperty{
				{Name: "t", Type: v1alpha1.PropertyInt, Visitors: &v1alpha1.VisitorConfig{ProtocolName: "modbus", ConfigData: js(`{"address":1}`)}},
				{Name: "s", Type: v1alpha1.PropertyInt, AccessMode: v1alpha1.ReadWrite},
			}}}
	d := &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "d", Generation: 7},
		Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "m"}, MapperName: "plc",
			Protocol: v1alpha1.ProtocolConfig{ConfigData: js(`{"address":"10.0.0.1:502","unitId":2}`)},
			Properties: []v1alpha1.DeviceProperty{
				{Name: "t", CollectCycle: ptr.To(intstr.FromString("250ms")), ReportCycle: ptr.To(intstr.FromInt32(10000))},
				{Name: "s", Desired: &v1alpha1.TwinProperty{Value: "5", Metadata: map[string]string{"by": "me"}}, ReportToCloud: ptr.To(false),
					Visitors: &v1alpha1.VisitorConfig{ProtocolName: "modbus", ConfigData: js(`{"address":9}`)}},
			}}}
	ed, err := EdgeDevice(d, model)
	if err != nil {
		t.Fatal(err)
	}
	if ed.ProtocolName != "modbus" || ed.Mapper != "plc" || ed.Generation != 7 || ed.Model != "m" {
		t.Errorf("device %v: want the model's protocol, the mapper name, generation and model", ed)
	}
	cfg := ed.ProtocolConfig.AsMap()
	if cfg["address"] != "10.0.0.1:502" || cfg["unitId"] != float64(2) || cfg["timeout"] != "1s" {
		t.Errorf("protocol config %v: want the Device's keys over the model's", cfg)
	}
	p0, p1 := ed.Properties[0], ed.Properties[1]
	if p0.CollectCycleMs != 250 || p0.ReportCycleMs != 10000 || !p0.ReportToCloud || p0.VisitorConfig.AsMap()["address"] != float64(1) {
		t.Errorf("property t %v: want 250 ms, 10 s, reportToCloud and the model's visitor", p0)
	}
	if p1.Desired.GetValue() != "5" || p1.Desired.Metadata["by"] != "me" || p1.ReportToCloud || p1.VisitorConfig.AsMap()["address"] != float64(9) {
		t.Errorf("property s %v: want its desired value, reportToCloud false and its own visitor", p1)
	}
	if ed.NoStateReports || ed.StateReportCycleMs != 0 {
		t.Errorf("no stateReport: states %v every %d ms, want reported at the mapper's default", !ed.NoStateReports, ed.StateReportCycleMs)
	}
	// KubeEdge 1.23's spec.stateReport and pushMethod.anomalyDetection.
	d.Spec.StateReport = &v1alpha1.StateReport{ReportToCloud: ptr.To(false), ReportCycle: ptr.To(intstr.FromString("30s"))}
	d.Spec.Properties[0].PushMethod = &v1alpha1.PushMethod{AnomalyDetection: js(`{"service":"http://ad:8080","threshold":3}`)}
	if ed, err = EdgeDevice(d, model); err != nil {
		t.Fatal(err)
	}
	if !ed.NoStateReports || ed.StateReportCycleMs != 30000 {
		t.Errorf("stateReport off every 30s sent as states %v every %d ms", !ed.NoStateReports, ed.StateReportCycleMs)
	}
	if ad := ed.Properties[0].GetPushMethod().GetAnomalyDetection().AsMap(); ad["service"] != "http://ad:8080" || ad["threshold"] != float64(3) {
		t.Errorf("anomalyDetection sent as %v", ad)
	}
	d.Spec.Properties[0].PushMethod.AnomalyDetection = js(`{}`)
	if ed, err = EdgeDevice(d, model); err != nil || ed.Properties[0].GetPushMethod().GetAnomalyDetection() == nil {
		t.Errorf("an empty anomalyDetection object was dropped (%v): it still names the sink", err)
	}
	d.Spec.Protocol.ConfigData = js(`[1,2]`)
	if _, err := EdgeDevice(d, model); err == nil {
		t.Error("configData that is not an object was accepted")
	}
}

// TestDesiredApplied: True only once every desired value is observed
// (numbers compared as numbers), absent without desired values.
func TestDesiredApplied(t *testing.T) {
	d := &v1alpha1.Device{Spec: v1alpha1.DeviceSpec{Properties: []v1alpha1.DeviceProperty{
		{Name: "a", Desired: &v1alpha1.TwinProperty{Value: "1.50"}}, {Name: "b", Desired: &v1alpha1.TwinProperty{Value: "on"}}, {Name: "c"}}}}
	st := &v1alpha1.DeviceStatus{Twins: []v1alpha1.Twin{{PropertyName: "a", ObservedDesired: &v1alpha1.TwinProperty{Value: "1.5"}}}}
	desiredApplied(d, st)
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDesiredApplied); c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("condition %+v, want False while b is not observed", c)
	}
	st.Twins = append(st.Twins, v1alpha1.Twin{PropertyName: "b", ObservedDesired: &v1alpha1.TwinProperty{Value: "on"}})
	desiredApplied(d, st)
	if !meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionDesiredApplied) {
		t.Fatalf("conditions %+v, want DesiredApplied True", st.Conditions)
	}
	// The mapper could not write b's new value: its error is the reason.
	d.Spec.Properties[1].Desired.Value = "off"
	st.Twins[1].Reported = &v1alpha1.TwinProperty{Value: "on", Metadata: map[string]string{twinvalue.MetaDesiredError: "coil 3 is read-only"}}
	desiredApplied(d, st)
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDesiredApplied); c == nil || c.Reason != "MapperError" || !strings.Contains(c.Message, "b: coil 3 is read-only") {
		t.Fatalf("condition %+v, want False with the mapper's error", c)
	}
	d.Spec.Properties = d.Spec.Properties[2:]
	desiredApplied(d, st)
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDesiredApplied); c != nil {
		t.Fatalf("condition %+v without desired values, want none", c)
	}
}
