// Command kubeedge-mapper is a test peer for Dowse's mapper API: a mapper
// built the way KubeEdge's template mapper is, on mapper-framework v1.21.0
// (go.mod) or v1.23.0 (go.1.23.mod: go build -modfile=go.1.23.mod) (config.Parse, grpcclient.RegisterMapper/ReportDeviceStatus/
// ReportDeviceStates, grpcserver serving DeviceMapperService), with a small
// in-memory "virtual" device driver of its own.
//
// Virtual devices: each property starts at the value of its visitor
// configData key "initial" (an integer, a float or a string; "0" when
// absent) and is reported every collectCycle (default 1s) with the desired
// value the mapper holds as observedDesired. A desired value, on
// registration or update, is written to the property at once (desired
// writes apply). Device states are reported as "ok" every status.reportCycle
// milliseconds (1s when 0) when status.reportToCloud is set, as the
// template's device states are.
//
// For tests it prints one line per event on stdout:
//
//	EVENT registered devices=N models=M
//	EVENT device-started id=NS/NAME desired=PROP:VALUE,... states=BOOL state-cycle=MS
//	EVENT anomaly-detection id=NS/NAME property=P config=JSON
//	EVENT device-removed id=NS/NAME
//	EVENT report-ok id=NS/NAME property=P value=V
//	EVENT report-refused id=NS/NAME property=P code=CODE message=...
//	EVENT pushed id=NS/NAME property=P topic=T value=V
//	EVENT push-failed id=NS/NAME property=P error=...
//
// A property whose pushMethod is MQTT is published as the template's
// data/publish/mqtt publishes it (see push).
//
// Flags: --config-file (mapper-framework's config.yaml: grpc_server.socket_path,
// common.name/protocol/edgecore_sock).
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	dmiapi "github.com/kubeedge/api/apis/dmi/v1beta1"
	"github.com/kubeedge/mapper-framework/pkg/common"
	"github.com/kubeedge/mapper-framework/pkg/config"
	"github.com/kubeedge/mapper-framework/pkg/grpcclient"
	"github.com/kubeedge/mapper-framework/pkg/grpcserver"
	"github.com/kubeedge/mapper-framework/pkg/util/parse"
)

var outMu sync.Mutex

func event(format string, args ...any) {
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Printf("EVENT "+format+"\n", args...)
}

func main() {
	c, err := config.Parse()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// The agent may come up after the mapper: retry as a DaemonSet would
	// by restarting (the template mapper exits at once).
	var devs []*dmiapi.Device
	var models []*dmiapi.DeviceModel
	for i := 0; ; i++ {
		if devs, models, err = grpcclient.RegisterMapper(true); err == nil {
			break
		}
		if i == 100 {
			fmt.Fprintln(os.Stderr, "register:", err)
			os.Exit(1)
		}
		time.Sleep(100 * time.Millisecond)
	}
	event("registered devices=%d models=%d", len(devs), len(models))
	panel := newPanel()
	if err := panel.DevInit(devs, models); err != nil {
		fmt.Fprintln(os.Stderr, "devinit:", err)
		os.Exit(1)
	}
	srv := grpcserver.NewServer(grpcserver.Config{SockPath: c.GrpcServer.SocketPath, Protocol: common.ProtocolCustomized}, panel)
	if err := srv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
}

type vdev struct {
	instance *common.DeviceInstance
	mu       sync.Mutex
	values   map[string]string
	stop     chan struct{}
	done     chan struct{}
}

type panel struct {
	mu      sync.Mutex
	models  map[string]common.DeviceModel
	devices map[string]*vdev
}

func newPanel() *panel {
	return &panel{models: map[string]common.DeviceModel{}, devices: map[string]*vdev{}}
}

func (p *panel) DevStart() {}

func (p *panel) DevInit(deviceList []*dmiapi.Device, deviceModelList []*dmiapi.DeviceModel) error {
	for _, m := range deviceModelList {
		model := parse.GetDeviceModelFromGrpc(m)
		p.UpdateModel(&model)
	}
	for _, d := range deviceList {
		model, err := p.GetModel(parse.GetResourceID(d.GetNamespace(), d.GetSpec().GetDeviceModelReference()))
		if err != nil {
			return err
		}
		proto, err := parse.BuildProtocolFromGrpc(d)
		if err != nil {
			return err
		}
		inst, err := parse.GetDeviceFromGrpc(d, &model)
		if err != nil {
			return err
		}
		inst.PProtocol = proto
		p.UpdateDev(&model, inst)
	}
	return nil
}

// initial reads the visitor configData's "initial" key.
func initial(t common.Twin) string {
	if t.Property == nil || len(t.Property.Visitors) == 0 {
		return "0"
	}
	var v struct {
		ConfigData map[string]any `json:"configData"`
	}
	if err := json.Unmarshal(t.Property.Visitors, &v); err != nil {
		return "0"
	}
	x, ok := v.ConfigData["initial"]
	if !ok {
		return "0"
	}
	s, err := common.ConvertToString(x)
	if err != nil {
		return "0"
	}
	return s
}

func (p *panel) UpdateDev(model *common.DeviceModel, inst *common.DeviceInstance) {
	p.mu.Lock()
	old := p.devices[inst.ID]
	d := &vdev{instance: inst, values: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	p.devices[inst.ID] = d
	p.models[model.ID] = *model
	p.mu.Unlock()
	if old != nil {
		close(old.stop)
		<-old.done
	}
	var desired []string
	d.mu.Lock()
	for _, t := range inst.Twins {
		d.values[t.PropertyName] = initial(t)
		if t.ObservedDesired.Value != "" {
			d.values[t.PropertyName] = t.ObservedDesired.Value // the desired write applies
			desired = append(desired, t.PropertyName+":"+t.ObservedDesired.Value)
		}
	}
	d.mu.Unlock()
	sort.Strings(desired)
	event("device-started id=%s desired=%s states=%t state-cycle=%d", inst.ID, strings.Join(desired, ","), inst.Status.ReportToCloud, inst.Status.ReportCycle)
	go d.run()
	for _, t := range inst.Twins {
		if ad := anomalyDetection(t); ad != "" {
			event("anomaly-detection id=%s property=%s config=%s", inst.ID, t.PropertyName, ad)
		}
	}
	for _, t := range inst.Twins {
		if t.Property != nil && t.Property.PushMethod.MethodName == common.PushMethodMQTT && t.Property.PushMethod.MethodConfig != nil {
			go d.push(t)
		}
	}
}

// push is the template mapper's MQTT data plane (its data/publish/mqtt,
// started by its device's pushHandler): every reportCycle (the
// framework's default when 0) it reads the property and publishes
// "time is <read time>  <topic>: <value>" to the pushMethod's broker with
// its qos and retained flag, on a connection of its own each time, as the
// template does.
func (d *vdev) push(t common.Twin) {
	var cfg struct {
		Address  string `json:"address"`
		Topic    string `json:"topic"`
		QoS      int    `json:"qos"`
		Retained bool   `json:"retained"`
	}
	if err := json.Unmarshal(t.Property.PushMethod.MethodConfig, &cfg); err != nil {
		event("push-refused id=%s property=%s error=%v", d.instance.ID, t.PropertyName, err)
		return
	}
	cycle := time.Duration(t.Property.ReportCycle) * time.Millisecond
	if cycle == 0 {
		cycle = common.DefaultReportCycle
	}
	tick := time.NewTicker(cycle)
	defer tick.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-tick.C:
		}
		d.mu.Lock()
		v := d.values[t.PropertyName]
		d.mu.Unlock()
		c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(cfg.Address))
		if tok := c.Connect(); tok.Wait() && tok.Error() != nil {
			event("push-failed id=%s property=%s error=%v", d.instance.ID, t.PropertyName, tok.Error())
			continue
		}
		msg := "time is " + time.Now().Format("2006-01-02 15:04:05") + "  " + cfg.Topic + ": " + v
		tok := c.Publish(cfg.Topic, byte(cfg.QoS), cfg.Retained, msg)
		tok.Wait()
		c.Disconnect(250)
		if tok.Error() != nil {
			event("push-failed id=%s property=%s error=%v", d.instance.ID, t.PropertyName, tok.Error())
			continue
		}
		event("pushed id=%s property=%s topic=%s value=%s", d.instance.ID, t.PropertyName, cfg.Topic, v)
	}
}

// anomalyDetection is the property's anomaly detection configuration as
// mapper-framework v1.23 hands it to a mapper (its PushMethodConfig's
// anomalyDetectionConfig); "" with v1.21, which has no such field.
func anomalyDetection(t common.Twin) string {
	if t.Property == nil {
		return ""
	}
	b, err := json.Marshal(t.Property.PushMethod)
	if err != nil {
		return ""
	}
	var pm struct {
		Config json.RawMessage `json:"anomalyDetectionConfig"`
	}
	if json.Unmarshal(b, &pm) != nil {
		return ""
	}
	return string(pm.Config)
}

func (d *vdev) run() {
	defer close(d.done)
	cycle := time.Second
	for _, t := range d.instance.Twins {
		if t.Property != nil && t.Property.CollectCycle > 0 {
			cycle = min(cycle, time.Duration(t.Property.CollectCycle)*time.Millisecond)
		}
	}
	tick := time.NewTicker(cycle)
	defer tick.Stop()
	// The template reports states on a cycle of their own, only when asked.
	var states <-chan time.Time
	if d.instance.Status.ReportToCloud {
		stateCycle := time.Duration(d.instance.Status.ReportCycle) * time.Millisecond
		if stateCycle <= 0 {
			stateCycle = time.Second
		}
		t := time.NewTicker(stateCycle)
		defer t.Stop()
		states = t.C
		d.reportState()
	}
	for {
		d.report()
		select {
		case <-d.stop:
			return
		case <-tick.C:
		case <-states:
			d.reportState()
		}
	}
}

func (d *vdev) reportState() {
	inst := d.instance
	if err := grpcclient.ReportDeviceStates(&dmiapi.ReportDeviceStatesRequest{DeviceName: inst.Name, DeviceNamespace: inst.Namespace, State: common.DeviceStatusOK}); err != nil {
		klog.V(2).Infof("state of %s: %v", inst.ID, err)
	}
}

// report sends each property in a request of its own, as the template's
// TwinData does.
func (d *vdev) report() {
	inst := d.instance
	for _, t := range inst.Twins {
		d.mu.Lock()
		v := d.values[t.PropertyName]
		d.mu.Unlock()
		req := &dmiapi.ReportDeviceStatusRequest{DeviceName: inst.Name, DeviceNamespace: inst.Namespace, ReportedDevice: &dmiapi.DeviceStatus{
			Twins: []*dmiapi.Twin{{
				PropertyName:    t.PropertyName,
				Reported:        &dmiapi.TwinProperty{Value: v, Metadata: map[string]string{"timestamp": fmt.Sprint(time.Now().UnixMilli()), "type": t.ObservedDesired.Metadata.Type}},
				ObservedDesired: &dmiapi.TwinProperty{Value: t.ObservedDesired.Value, Metadata: map[string]string{"type": t.ObservedDesired.Metadata.Type}},
			}},
		}}
		if err := grpcclient.ReportDeviceStatus(req); err != nil {
			st := status.Convert(err)
			event("report-refused id=%s property=%s code=%s message=%s", inst.ID, t.PropertyName, st.Code(), st.Message())
		} else {
			event("report-ok id=%s property=%s value=%s", inst.ID, t.PropertyName, v)
		}
	}
}

func (p *panel) UpdateDevTwins(deviceID string, twins []common.Twin) error {
	p.mu.Lock()
	d := p.devices[deviceID]
	p.mu.Unlock()
	if d == nil {
		return fmt.Errorf("device %s not found", deviceID)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range twins {
		if t.ObservedDesired.Value != "" {
			d.values[t.PropertyName] = t.ObservedDesired.Value
		}
	}
	return nil
}

func (p *panel) DealDeviceTwinGet(deviceID, twinName string) (any, error) {
	v, _, err := p.GetTwinResult(deviceID, twinName)
	return v, err
}

func (p *panel) GetDevice(deviceID string) (any, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.devices[deviceID]
	if d == nil {
		return nil, fmt.Errorf("device %s not found", deviceID)
	}
	return struct{ Instance common.DeviceInstance }{*d.instance}, nil
}

func (p *panel) RemoveDevice(deviceID string) error {
	p.mu.Lock()
	d := p.devices[deviceID]
	delete(p.devices, deviceID)
	p.mu.Unlock()
	if d == nil {
		return fmt.Errorf("device %s not found", deviceID)
	}
	close(d.stop)
	<-d.done
	event("device-removed id=%s", deviceID)
	return nil
}

func (p *panel) WriteDevice(_, deviceID, propertyName, data string) error {
	p.mu.Lock()
	d := p.devices[deviceID]
	p.mu.Unlock()
	if d == nil {
		return fmt.Errorf("device %s not found", deviceID)
	}
	d.mu.Lock()
	d.values[propertyName] = data
	d.mu.Unlock()
	return nil
}

func (p *panel) GetModel(modelID string) (common.DeviceModel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.models[modelID]
	if !ok {
		return common.DeviceModel{}, fmt.Errorf("model %s not found", modelID)
	}
	return m, nil
}

func (p *panel) UpdateModel(model *common.DeviceModel) {
	p.mu.Lock()
	p.models[model.ID] = *model
	p.mu.Unlock()
}

func (p *panel) RemoveModel(modelID string) {
	p.mu.Lock()
	delete(p.models, modelID)
	p.mu.Unlock()
}

func (p *panel) GetTwinResult(deviceID, twinName string) (string, string, error) {
	p.mu.Lock()
	d := p.devices[deviceID]
	p.mu.Unlock()
	if d == nil {
		return "", "", fmt.Errorf("device %s not found", deviceID)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.values[twinName]
	if !ok {
		return "", "", errors.New("no such property")
	}
	return v, "string", nil
}

func (p *panel) GetDeviceMethod(deviceID string) (map[string][]string, map[string]string, error) {
	return map[string][]string{}, map[string]string{}, nil
}
