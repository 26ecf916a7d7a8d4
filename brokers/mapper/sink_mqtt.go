package mapper

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// mqttBroker checks a pushMethod's broker address (the schemes the CRD
// allows, which paho dials).
func mqttBroker(addr string) (string, error) {
	u, err := url.Parse(addr)
	if err != nil {
		return "", fmt.Errorf("%q is not a URL: %w", addr, err)
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss":
	default:
		return "", fmt.Errorf("%q: scheme must be tcp, mqtt, ssl, tls, mqtts, ws or wss", addr)
	}
	if u.Hostname() == "" {
		return "", fmt.Errorf("%q names no host", addr)
	}
	if u.Port() == "" {
		// paho needs one; MQTT's registered ports.
		port := "1883"
		switch u.Scheme {
		case "ssl", "tls", "mqtts":
			port = "8883"
		case "ws":
			port = "80"
		case "wss":
			port = "443"
		}
		u.Host += ":" + port
	}
	return u.String(), nil
}

// mqttClientID is unique per mapper process and sink (a broker drops the
// older of two connections with one id), at most 23 bytes where it can be
// (MQTT 3.1.1's guaranteed length).
func mqttClientID(mapper, sum string) string {
	host, _ := os.Hostname()
	id := fmt.Sprintf("dowse-%s-%s-%d-%s", mapper, host, os.Getpid(), sum)
	return id
}

// mqttTransport publishes with Eclipse Paho (MQTT 3.1.1) on one connection
// it opens itself: paho's own reconnect and store are off, the sink's
// buffer and backoff are the only ones, so a reading is forgotten only
// after the broker acknowledged it (QoS 1 and 2) or it was written (QoS 0).
type mqttTransport struct {
	address, clientID string
	creds             credentialSource
	timeout           time.Duration
	client            mqtt.Client
	lostCh            chan struct{}
}

func (t *mqttTransport) connect(ctx context.Context) error {
	c, err := t.creds.load()
	if err != nil {
		return err
	}
	opts := mqtt.NewClientOptions().AddBroker(t.address).SetClientID(t.clientID).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectRetry(false).
		// No write timeout: paho would start a timer per packet; a stuck
		// connection shows as an acknowledgement overdue (the sink closes it).
		SetConnectTimeout(t.timeout).SetKeepAlive(30 * time.Second).
		SetPingTimeout(t.timeout).SetOrderMatters(false)
	if c.username != "" {
		opts.SetUsername(c.username)
	}
	if c.password != "" {
		opts.SetPassword(c.password)
	}
	if strings.HasPrefix(t.address, "ssl:") || strings.HasPrefix(t.address, "tls:") || strings.HasPrefix(t.address, "mqtts:") || strings.HasPrefix(t.address, "wss:") {
		tc, err := c.tlsConfig()
		if err != nil {
			return err
		}
		opts.SetTLSConfig(tc)
	}
	lost := make(chan struct{})
	opts.SetConnectionLostHandler(func(mqtt.Client, error) { close(lost) })
	client := mqtt.NewClient(opts)
	tok := client.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		client.Disconnect(0)
		return ctx.Err()
	}
	if err := tok.Error(); err != nil {
		if errors.Is(err, packets.ErrorRefusedNotAuthorised) || errors.Is(err, packets.ErrorRefusedBadUsernameOrPassword) {
			return fmt.Errorf("broker %s %w the login: %w", redact(t.address), errSinkRefused, err)
		}
		return fmt.Errorf("connecting to broker %s: %w", redact(t.address), err)
	}
	t.client, t.lostCh = client, lost
	return nil
}

func (t *mqttTransport) publish(r *reading) inflight {
	return t.client.Publish(r.topic, r.qos, r.retained, r.payload)
}

func (t *mqttTransport) lost() <-chan struct{} { return t.lostCh }

// deliver is unused (the sink pipelines publish), there for transport.
func (t *mqttTransport) deliver(context.Context, []*reading) (done, refused int, refusal, err error) {
	return 0, 0, nil, errors.New("mqtt delivers by publish")
}

func (t *mqttTransport) close() {
	if t.client != nil {
		t.client.Disconnect(100)
		t.client = nil
	}
}
