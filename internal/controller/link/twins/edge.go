// Package twins keeps Devices in step with their nodes over the cloud/edge
// link: it sends each node its Devices and DeviceModels (desired values
// ride them) and writes what nodes report into Device.status, which it alone
// writes.
package twins

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// EdgeDevice is what the node is sent of d: the model's protocol, default
// protocol configuration and default visitors filled in.
func EdgeDevice(d *v1alpha1.Device, model *v1alpha1.DeviceModel) (*linkv1.EdgeDevice, error) {
	out := &linkv1.EdgeDevice{
		Ref:          &linkv1.DeviceRef{Namespace: d.Namespace, Name: d.Name},
		Generation:   d.Generation,
		Model:        d.Spec.DeviceModelRef.Name,
		Mapper:       d.Spec.MapperName,
		ProtocolName: d.Spec.Protocol.ProtocolName,
	}
	if out.ProtocolName == "" {
		out.ProtocolName = model.Spec.Protocol
	}
	cfg, err := mergeObjects(model.Spec.ProtocolConfigData, d.Spec.Protocol.ConfigData)
	if err != nil {
		return nil, fmt.Errorf("protocol configData: %w", err)
	}
	out.ProtocolConfig = cfg
	for i := range d.Spec.Properties {
		p := &d.Spec.Properties[i]
		ep := &linkv1.EdgeDeviceProperty{Name: p.Name, ReportToCloud: p.Reports()}
		if p.Desired != nil {
			ep.Desired = &linkv1.TwinValue{Value: p.Desired.Value, Metadata: maps.Clone(p.Desired.Metadata)}
		}
		visitors := p.Visitors
		if visitors == nil {
			if mp := model.Property(p.Name); mp != nil {
				visitors = mp.Visitors
			}
		}
		if visitors != nil {
			ep.VisitorProtocol = visitors.ProtocolName
			if ep.VisitorConfig, err = mergeObjects(nil, visitors.ConfigData); err != nil {
				return nil, fmt.Errorf("property %s visitors: %w", p.Name, err)
			}
		}
		collect, err := v1alpha1.CycleDuration(p.CollectCycle)
		if err != nil {
			return nil, fmt.Errorf("property %s: %w", p.Name, err)
		}
		report, err := v1alpha1.CycleDuration(p.ReportCycle)
		if err != nil {
			return nil, fmt.Errorf("property %s: %w", p.Name, err)
		}
		ep.CollectCycleMs, ep.ReportCycleMs = collect.Milliseconds(), report.Milliseconds()
		if ep.PushMethod, err = edgePushMethod(p.PushMethod); err != nil {
			return nil, fmt.Errorf("property %s: %w", p.Name, err)
		}
		out.Properties = append(out.Properties, ep)
	}
	for _, m := range d.Spec.Methods {
		out.Methods = append(out.Methods, &linkv1.EdgeDeviceMethod{Name: m.Name, Description: m.Description, PropertyNames: m.PropertyNames})
	}
	out.NoStateReports = !d.Spec.StateReport.Reports()
	if sr := d.Spec.StateReport; sr != nil {
		cycle, err := v1alpha1.CycleDuration(sr.ReportCycle)
		if err != nil {
			return nil, fmt.Errorf("stateReport: %w", err)
		}
		out.StateReportCycleMs = cycle.Milliseconds()
	}
	return out, nil
}

// EdgeModel is what a node is sent of m.
func EdgeModel(m *v1alpha1.DeviceModel) *linkv1.EdgeDeviceModel {
	out := &linkv1.EdgeDeviceModel{Ref: &linkv1.DeviceRef{Namespace: m.Namespace, Name: m.Name}, Generation: m.Generation, Protocol: m.Spec.Protocol}
	for _, p := range m.Spec.Properties {
		mode := p.AccessMode
		if mode == "" {
			mode = v1alpha1.ReadOnly
		}
		out.Properties = append(out.Properties, &linkv1.EdgeModelProperty{
			Name: p.Name, Description: p.Description, Type: string(p.Type), AccessMode: string(mode),
			Minimum: p.Minimum, Maximum: p.Maximum, Unit: p.Unit,
		})
	}
	return out
}

// mergeObjects reads two JSON objects and returns over's keys laid on
// base's (one level deep), as a Struct; nil when both are empty.
func mergeObjects(base, over *apiextensionsv1.JSON) (*structpb.Struct, error) {
	m := map[string]any{}
	for _, j := range []*apiextensionsv1.JSON{base, over} {
		if j == nil || len(j.Raw) == 0 {
			continue
		}
		var o map[string]any
		if err := json.Unmarshal(j.Raw, &o); err != nil {
			return nil, fmt.Errorf("not a JSON object: %w", err)
		}
		maps.Copy(m, o)
	}
	if len(m) == 0 {
		return nil, nil
	}
	return structpb.NewStruct(m)
}

// edgePushMethod is what the node is sent of a property's pushMethod.
func edgePushMethod(pm *v1alpha1.PushMethod) (*linkv1.PushMethod, error) {
	if pm == nil {
		return nil, nil
	}
	out := &linkv1.PushMethod{}
	if pm.AnomalyDetection != nil {
		ad, err := mergeObjects(nil, pm.AnomalyDetection)
		if err != nil {
			return nil, fmt.Errorf("pushMethod.anomalyDetection: %w", err)
		}
		// An empty object still names the sink.
		if ad == nil {
			ad = &structpb.Struct{}
		}
		out.AnomalyDetection = ad
	}
	if h := pm.HTTP; h != nil {
		out.Http = &linkv1.PushMethodHTTP{HostName: h.HostName, Port: h.Port, RequestPath: h.RequestPath, Timeout: h.Timeout}
	}
	if m := pm.MQTT; m != nil {
		out.Mqtt = &linkv1.PushMethodMQTT{Address: m.Address, Topic: m.Topic, Qos: m.QoS, Retained: m.Retained}
	}
	if o := pm.OTEL; o != nil {
		out.Otel = &linkv1.PushMethodOTEL{EndpointUrl: o.EndpointURL}
	}
	if r := pm.SecretRef; r != nil {
		out.SecretName = r.Name
	}
	db := pm.DBMethod
	if db == nil {
		return out, nil
	}
	out.DbMethod = &linkv1.DBMethod{}
	if x := db.Influxdb2; x != nil {
		e := &linkv1.DBMethodInfluxdb2{}
		if c := x.Influxdb2ClientConfig; c != nil {
			e.ClientConfig = &linkv1.Influxdb2ClientConfig{Url: c.URL, Org: c.Org, Bucket: c.Bucket}
		}
		if c := x.Influxdb2DataConfig; c != nil {
			e.DataConfig = &linkv1.Influxdb2DataConfig{Measurement: c.Measurement, Tag: maps.Clone(c.Tag), FieldKey: c.FieldKey}
		}
		out.DbMethod.Influxdb2 = e
	}
	if x := db.Redis; x != nil {
		e := &linkv1.DBMethodRedis{}
		if c := x.RedisClientConfig; c != nil {
			e.ClientConfig = &linkv1.RedisClientConfig{Addr: c.Addr, Db: c.DB, Poolsize: c.Poolsize, MinIdleConns: c.MinIdleConns}
		}
		out.DbMethod.Redis = e
	}
	if x := db.TDEngine; x != nil {
		e := &linkv1.DBMethodTDEngine{}
		if c := x.TDEngineClientConfig; c != nil {
			e.ClientConfig = &linkv1.TDEngineClientConfig{Addr: c.Addr, DbName: c.DBName}
		}
		out.DbMethod.Tdengine = e
	}
	if x := db.Mysql; x != nil {
		e := &linkv1.DBMethodMySQL{}
		if c := x.MySQLClientConfig; c != nil {
			e.ClientConfig = &linkv1.MySQLClientConfig{Addr: c.Addr, Database: c.Database, UserName: c.UserName}
		}
		out.DbMethod.Mysql = e
	}
	return out, nil
}

// PushMethodError lists what is wrong with a Device's pushMethods, each
// naming its field; the properties it names are sent to the node without
// their pushMethod (the twin works on).
type PushMethodError struct {
	Problems   []string
	Properties map[string]bool
}

func (e *PushMethodError) Error() string { return strings.Join(e.Problems, "; ") }

// PushMethodProblems checks each property's pushMethod as the API server
// cannot: a ${NAME} left unsubstituted, an address that does not parse,
// a Secret that does not exist (secretExists nil: not checked). nil when
// all are good.
func PushMethodProblems(ctx context.Context, d *v1alpha1.Device, secretExists func(ctx context.Context, namespace, name string) (bool, error)) (*PushMethodError, error) {
	out := &PushMethodError{Properties: map[string]bool{}}
	var prop string
	bad := func(field, why string) {
		out.Problems = append(out.Problems, field+": "+why)
		out.Properties[prop] = true
	}
	for i := range d.Spec.Properties {
		prop = d.Spec.Properties[i].Name
		pm := d.Spec.Properties[i].PushMethod
		if pm == nil {
			continue
		}
		f := fmt.Sprintf("spec.properties[%d].pushMethod", i)
		if h := pm.HTTP; h != nil {
			if u, err := url.Parse(h.HostName); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Port() != "" || (u.Path != "" && u.Path != "/") {
				bad(f+".http.hostName", fmt.Sprintf("%q is not http:// or https:// and a host", h.HostName))
			}
			if h.Port < 1 || h.Port > 65535 {
				bad(f+".http.port", fmt.Sprintf("%d is not a port (1-65535)", h.Port))
			}
			if h.RequestPath != "" && !strings.HasPrefix(h.RequestPath, "/") {
				bad(f+".http.requestPath", fmt.Sprintf("%q does not start with /", h.RequestPath))
			}
		}
		if m := pm.MQTT; m != nil {
			if u, err := url.Parse(m.Address); err != nil || !slices.Contains([]string{"tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss"}, u.Scheme) || u.Hostname() == "" {
				bad(f+".mqtt.address", fmt.Sprintf("%q is not a broker URL (tcp://, mqtt://, ssl://, tls://, mqtts://, ws://, wss://)", m.Address))
			} else if p := u.Port(); p != "" {
				if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
					bad(f+".mqtt.address", fmt.Sprintf("port %q is not 1-65535", p))
				}
			}
			if m.Topic == "" || strings.ContainsAny(m.Topic, "+#") {
				bad(f+".mqtt.topic", fmt.Sprintf("%q is not a topic to publish on", m.Topic))
			}
		}
		if o := pm.OTEL; o != nil {
			if u, err := url.Parse(o.EndpointURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				bad(f+".otel.endpointURL", fmt.Sprintf("%q is not an http:// or https:// URL", o.EndpointURL))
			}
		}
		if db := pm.DBMethod; db != nil {
			hostPort := func(field, addr string) {
				if _, p, err := net.SplitHostPort(addr); err != nil {
					bad(field, fmt.Sprintf("%q is not host:port", addr))
				} else if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
					bad(field, fmt.Sprintf("port %q is not 1-65535", p))
				}
			}
			if x := db.Redis; x != nil && x.RedisClientConfig != nil {
				hostPort(f+".dbMethod.redis.redisClientConfig.addr", x.RedisClientConfig.Addr)
			}
			if x := db.Mysql; x != nil && x.MySQLClientConfig != nil {
				hostPort(f+".dbMethod.mysql.mysqlClientConfig.addr", x.MySQLClientConfig.Addr)
			}
			if x := db.TDEngine; x != nil && x.TDEngineClientConfig != nil {
				hostPort(f+".dbMethod.TDEngine.TDEngineClientConfig.addr", x.TDEngineClientConfig.Addr)
			}
			if x := db.Influxdb2; x != nil && x.Influxdb2ClientConfig != nil {
				if u, err := url.Parse(x.Influxdb2ClientConfig.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					bad(f+".dbMethod.influxdb2.influxdb2ClientConfig.url", fmt.Sprintf("%q is not an http:// or https:// URL", x.Influxdb2ClientConfig.URL))
				}
			}
		}
		if r := pm.SecretRef; r != nil && secretExists != nil {
			ok, err := secretExists(ctx, d.Namespace, r.Name)
			if err != nil {
				return nil, fmt.Errorf("%s.secretRef: %w", f, err)
			}
			if !ok {
				bad(f+".secretRef", fmt.Sprintf("Secret %s/%s does not exist", d.Namespace, r.Name))
			}
		}
	}
	if len(out.Problems) == 0 {
		return nil, nil
	}
	return out, nil
}
