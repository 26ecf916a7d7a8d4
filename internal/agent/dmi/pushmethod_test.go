package dmi

import (
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// TestPushMethodAsEdgecore: DMI's pushMethod is what edgecore makes of the
// same Device field (it JSON-marshals KubeEdge's v1beta1 property and
// unmarshals it onto DMI's generated structs, whose names match case
// insensitively), message for message, absent ones absent, with the
// Secret's name in Dowse's own field.
func TestPushMethodAsEdgecore(t *testing.T) {
	for name, c := range map[string]struct {
		crd  *v1alpha1.PushMethod
		link *linkv1.PushMethod
	}{
		"mqtt": {
			&v1alpha1.PushMethod{MQTT: &v1alpha1.PushMethodMQTT{Address: "tcp://127.0.0.1:1883", Topic: "t/1", QoS: 1, Retained: true}},
			&linkv1.PushMethod{Mqtt: &linkv1.PushMethodMQTT{Address: "tcp://127.0.0.1:1883", Topic: "t/1", Qos: 1, Retained: true}},
		},
		"http and influx": {
			&v1alpha1.PushMethod{HTTP: &v1alpha1.PushMethodHTTP{HostName: "http://10.0.0.5", Port: 8080, RequestPath: "/r", Timeout: 500},
				DBMethod: &v1alpha1.DBMethodConfig{Influxdb2: &v1alpha1.DBMethodInfluxdb2{
					Influxdb2ClientConfig: &v1alpha1.Influxdb2ClientConfig{URL: "http://i:8086", Org: "o", Bucket: "b"},
					Influxdb2DataConfig:   &v1alpha1.Influxdb2DataConfig{Measurement: "m", Tag: map[string]string{"k": "v"}, FieldKey: "f"}}}},
			&linkv1.PushMethod{Http: &linkv1.PushMethodHTTP{HostName: "http://10.0.0.5", Port: 8080, RequestPath: "/r", Timeout: 500},
				DbMethod: &linkv1.DBMethod{Influxdb2: &linkv1.DBMethodInfluxdb2{
					ClientConfig: &linkv1.Influxdb2ClientConfig{Url: "http://i:8086", Org: "o", Bucket: "b"},
					DataConfig:   &linkv1.Influxdb2DataConfig{Measurement: "m", Tag: map[string]string{"k": "v"}, FieldKey: "f"}}}},
		},
		"otel, redis with no client config": {
			&v1alpha1.PushMethod{OTEL: &v1alpha1.PushMethodOTEL{EndpointURL: "https://o:4318/v1/metrics"},
				DBMethod: &v1alpha1.DBMethodConfig{Redis: &v1alpha1.DBMethodRedis{}}},
			&linkv1.PushMethod{Otel: &linkv1.PushMethodOTEL{EndpointUrl: "https://o:4318/v1/metrics"},
				DbMethod: &linkv1.DBMethod{Redis: &linkv1.DBMethodRedis{}}},
		},
		"redis, tdengine, mysql": {
			&v1alpha1.PushMethod{DBMethod: &v1alpha1.DBMethodConfig{
				Redis:    &v1alpha1.DBMethodRedis{RedisClientConfig: &v1alpha1.RedisClientConfig{Addr: "r:6379", DB: 2, Poolsize: 3, MinIdleConns: 1}},
				TDEngine: &v1alpha1.DBMethodTDEngine{TDEngineClientConfig: &v1alpha1.TDEngineClientConfig{Addr: "t:6041", DBName: "d"}},
				Mysql:    &v1alpha1.DBMethodMySQL{MySQLClientConfig: &v1alpha1.MySQLClientConfig{Addr: "m:3306", Database: "d", UserName: "u"}}},
				SecretRef: &corev1.LocalObjectReference{Name: "creds"}},
			&linkv1.PushMethod{DbMethod: &linkv1.DBMethod{
				Redis:    &linkv1.DBMethodRedis{ClientConfig: &linkv1.RedisClientConfig{Addr: "r:6379", Db: 2, Poolsize: 3, MinIdleConns: 1}},
				Tdengine: &linkv1.DBMethodTDEngine{ClientConfig: &linkv1.TDEngineClientConfig{Addr: "t:6041", DbName: "d"}},
				Mysql:    &linkv1.DBMethodMySQL{ClientConfig: &linkv1.MySQLClientConfig{Addr: "m:3306", Database: "d", UserName: "u"}}},
				SecretName: "creds"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := json.Marshal(c.crd)
			if err != nil {
				t.Fatal(err)
			}
			var want dmiv1beta1.PushMethod
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatal(err)
			}
			// Edgecore's copy, plus Dowse's own field for the Secret's name.
			want.DowseSecretName = c.link.GetSecretName()
			if got := dmiPushMethod(c.link); !proto.Equal(got, &want) {
				t.Errorf("DMI pushMethod\n got %v\nwant %v (edgecore's copy of %s)", got, &want, b)
			}
		})
	}
	if dmiPushMethod(nil) != nil {
		t.Error("no pushMethod became one")
	}
}
