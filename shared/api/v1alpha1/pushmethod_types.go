package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// PushMethod is where the mapper sends every reading of a property besides
// the twin: KubeEdge's devices.kubeedge.io/v1beta1 pushMethod field for
// field, handed to the mapper in DMI's Device as edgecore hands it, so
// KubeEdge's mappers publish unchanged. Readings go from the mapper on the
// node straight to the broker or database, never through the API server.
//
// Departures: the API server checks addresses (schemes, ports, qos 0-2;
// a string holding ${NAME} is left to the controller, which checks it once
// a deviceTemplate's substitution is done), and secretRef (new) names a
// Secret with the sink's credentials. Credentials are never in the spec:
// the mapper reads them from that Secret mounted into its Pod, or from
// environment variables (see docs/user-guide/push-methods.md).
// +kubebuilder:validation:XValidation:rule="[has(self.http), has(self.mqtt), has(self.otel), has(self.anomalyDetection)].filter(x, x).size() <= 1",message="at most one of http, mqtt, otel and anomalyDetection"
// +kubebuilder:validation:XValidation:rule="has(self.http) || has(self.mqtt) || has(self.otel) || has(self.dbMethod) || has(self.anomalyDetection)",message="names no sink: set http, mqtt, otel, anomalyDetection or dbMethod"
type PushMethod struct {
	// HTTP posts each reading to an HTTP endpoint.
	// +optional
	HTTP *PushMethodHTTP `json:"http,omitempty"`
	// MQTT publishes each reading to an MQTT broker.
	// +optional
	MQTT *PushMethodMQTT `json:"mqtt,omitempty"`
	// OTEL exports readings as OpenTelemetry metrics (Dowse's mappers do
	// not serve it yet; KubeEdge's do).
	// +optional
	OTEL *PushMethodOTEL `json:"otel,omitempty"`
	// DBMethod writes each reading to a database.
	// +optional
	DBMethod *DBMethodConfig `json:"dbMethod,omitempty"`
	// AnomalyDetection is KubeEdge 1.23's anomaly detection service
	// configuration, a JSON object handed to the mapper as DMI's
	// AnomalyDetection (each value as edgecore converts configData).
	// Dowse's mappers do not serve it; KubeEdge's do.
	// +optional
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	AnomalyDetection *apiextensionsv1.JSON `json:"anomalyDetection,omitempty"`
	// SecretRef names a Secret (same namespace) with the sink's
	// credentials: keys username and password (and ca.crt for TLS). The
	// controller checks that it exists; the mapper reads it where its Pod
	// mounts it.
	// +optional
	SecretRef *corev1.LocalObjectReference `json:"secretRef,omitempty"`
}

// PushMethodHTTP is an HTTP endpoint: hostName:port + requestPath, as
// KubeEdge's mappers join them.
type PushMethodHTTP struct {
	// HostName is the scheme and host, e.g. http://10.0.0.5 (no port, no
	// path).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.contains('${') || self.matches('^https?://([A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\\\\[[0-9A-Fa-f:.]+\\\\])$')",message="must be http:// or https:// and a host name or address, without port or path"
	HostName string `json:"hostName,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int64 `json:"port,omitempty"`
	// RequestPath starts with /.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.contains('${') || self.startsWith('/')",message="must start with /"
	RequestPath string `json:"requestPath,omitempty"`
	// Timeout of one request, milliseconds (Dowse's mappers: 5000 when 0).
	// +optional
	// +kubebuilder:validation:Minimum=0
	Timeout int64 `json:"timeout,omitempty"`
}

// PushMethodMQTT is an MQTT broker and topic.
type PushMethodMQTT struct {
	// Address of the broker: tcp://, mqtt://, ssl://, tls://, mqtts://,
	// ws:// or wss:// and host:port, e.g. tcp://127.0.0.1:1883.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.contains('${') || (isURL(self) && url(self).getScheme() in ['tcp', 'mqtt', 'ssl', 'tls', 'mqtts', 'ws', 'wss'] && url(self).getHostname() != '')",message="must be a broker URL: tcp://, mqtt://, ssl://, tls://, mqtts://, ws:// or wss:// and a host"
	// +kubebuilder:validation:XValidation:rule="self.contains('${') || !isURL(self) || url(self).getPort() == '' || (int(url(self).getPort()) >= 1 && int(url(self).getPort()) <= 65535)",message="port must be 1-65535"
	Address string `json:"address,omitempty"`
	// Topic to publish on (no wildcards).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.contains('+') && !self.contains('#')",message="a topic to publish on takes no wildcards (+, #)"
	Topic string `json:"topic,omitempty"`
	// QoS of each publish: 0, 1 or 2.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2
	QoS int32 `json:"qos,omitempty"`
	// Retained asks the broker to keep the last reading for new
	// subscribers.
	// +optional
	Retained bool `json:"retained,omitempty"`
}

// PushMethodOTEL is an OpenTelemetry metrics endpoint.
type PushMethodOTEL struct {
	// EndpointURL, e.g. https://localhost:4318/v1/metrics.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.contains('${') || (isURL(self) && url(self).getScheme() in ['http', 'https'])",message="must be an http:// or https:// URL"
	EndpointURL string `json:"endpointURL,omitempty"`
}

// DBMethodConfig is a database; at most one.
// +kubebuilder:validation:XValidation:rule="[has(self.influxdb2), has(self.redis), has(self.TDEngine), has(self.mysql)].filter(x, x).size() == 1",message="exactly one of influxdb2, redis, TDEngine and mysql"
type DBMethodConfig struct {
	// +optional
	Influxdb2 *DBMethodInfluxdb2 `json:"influxdb2,omitempty"`
	// +optional
	Redis *DBMethodRedis `json:"redis,omitempty"`
	// +optional
	TDEngine *DBMethodTDEngine `json:"TDEngine,omitempty"`
	// +optional
	Mysql *DBMethodMySQL `json:"mysql,omitempty"`
}

// DBMethodInfluxdb2 is an InfluxDB 2 bucket (Dowse's mappers do not write
// to it yet; KubeEdge's do).
type DBMethodInfluxdb2 struct {
	// +optional
	Influxdb2ClientConfig *Influxdb2ClientConfig `json:"influxdb2ClientConfig,omitempty"`
	// +optional
	Influxdb2DataConfig *Influxdb2DataConfig `json:"influxdb2DataConfig,omitempty"`
}

type Influxdb2ClientConfig struct {
	// URL of the database, http:// or https://.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.contains('${') || (isURL(self) && url(self).getScheme() in ['http', 'https'])",message="must be an http:// or https:// URL"
	URL string `json:"url,omitempty"`
	// +optional
	Org string `json:"org,omitempty"`
	// +optional
	Bucket string `json:"bucket,omitempty"`
}

type Influxdb2DataConfig struct {
	// +optional
	Measurement string `json:"measurement,omitempty"`
	// +optional
	Tag map[string]string `json:"tag,omitempty"`
	// +optional
	FieldKey string `json:"fieldKey,omitempty"`
}

// DBMethodRedis is a Redis server: each reading is added to the sorted set
// <namespace>/<device>/<property>, scored by its read time (Unix ms).
type DBMethodRedis struct {
	// +optional
	RedisClientConfig *RedisClientConfig `json:"redisClientConfig,omitempty"`
}

type RedisClientConfig struct {
	// Addr is host:port.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.contains('${') || self.matches('^([^:/\\\\[\\\\]]+|\\\\[[0-9A-Fa-f:.]+\\\\]):[0-9]{1,5}$')",message="must be host:port"
	Addr string `json:"addr,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	DB int32 `json:"db,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	Poolsize int32 `json:"poolsize,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	MinIdleConns int32 `json:"minIdleConns,omitempty"`
}

// DBMethodTDEngine is a TDengine database (Dowse's mappers do not write to
// it yet; KubeEdge's do).
type DBMethodTDEngine struct {
	// +optional
	TDEngineClientConfig *TDEngineClientConfig `json:"TDEngineClientConfig,omitempty"`
}

type TDEngineClientConfig struct {
	// Addr is host:port.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.contains('${') || self.matches('^([^:/\\\\[\\\\]]+|\\\\[[0-9A-Fa-f:.]+\\\\]):[0-9]{1,5}$')",message="must be host:port"
	Addr string `json:"addr,omitempty"`
	// +optional
	DBName string `json:"dbName,omitempty"`
}

// DBMethodMySQL is a MySQL or MariaDB database: each reading is a row.
type DBMethodMySQL struct {
	// +optional
	MySQLClientConfig *MySQLClientConfig `json:"mysqlClientConfig,omitempty"`
}

type MySQLClientConfig struct {
	// Addr is host:port.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.contains('${') || self.matches('^([^:/\\\\[\\\\]]+|\\\\[[0-9A-Fa-f:.]+\\\\]):[0-9]{1,5}$')",message="must be host:port"
	Addr string `json:"addr,omitempty"`
	// +optional
	Database string `json:"database,omitempty"`
	// UserName; the password comes from secretRef or the environment.
	// +optional
	UserName string `json:"userName,omitempty"`
}
