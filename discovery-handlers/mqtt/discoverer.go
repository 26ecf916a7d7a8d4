package mqtt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/internal/sparkplug"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// DefaultName is the handler name Configurations use by default.
const DefaultName = "mqtt"

// NewDiscoverer returns the MQTT handler.Discoverer.
func NewDiscoverer() handler.Discoverer { return &discoverer{} }

// Handler is the MQTT handler as its binary serves it. A broker is
// reachable from any node, so it registers as shared: every node that sees
// a device agrees on one Instance (its id is the device's Sparkplug name or
// Home Assistant discovery topic).
func Handler() handler.Config {
	return handler.Config{Name: DefaultName, Shared: true, Discoverer: NewDiscoverer()}
}

type discoverer struct{}

// message is one message received.
type message struct {
	topic   string
	payload []byte
}

// connState is the connection's latest news, for the stream's loop.
type connState struct {
	mu      sync.Mutex
	err     string
	changed chan struct{}
}

func (c *connState) set(err string) {
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (c *connState) get() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Discover implements handler.Discoverer: it connects to the broker (and
// reconnects, resubscribing, for as long as the stream lasts), subscribes
// to the births and deaths and discovery configs the details select, and
// sends the devices whenever they change. A broker that cannot be reached
// or refuses the credentials is retried and reported as ConnectFailed.
func (*discoverer) Discover(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
	d, err := ParseDetails(req.GetDiscoveryDetails())
	if err != nil {
		return err
	}
	creds, err := parseCredentials(d, req.GetDiscoveryProperties())
	if err != nil {
		return err
	}
	log := logr.FromContextOrDiscard(ctx)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	msgs := make(chan message, 256)
	conn := &connState{changed: make(chan struct{}, 1)}
	topics := d.topics()
	client := paho.NewClient(clientOptions(d, creds, func(c paho.Client) {
		filters := make(map[string]byte, len(topics))
		for _, t := range topics {
			filters[t] = 1
		}
		tok := c.SubscribeMultiple(filters, func(_ paho.Client, m paho.Message) {
			select {
			case msgs <- message{topic: m.Topic(), payload: m.Payload()}:
			case <-ctx.Done():
			}
		})
		go func() {
			if tok.WaitTimeout(30*time.Second) && tok.Error() == nil {
				log.Info("mqtt subscribed", "broker", d.Broker, "topics", topics)
				conn.set("")
				return
			}
			err := tok.Error()
			if err == nil {
				err = errors.New("no answer to the subscription within 30s")
			}
			conn.set("subscribing: " + err.Error())
		}()
	}, func(n paho.ConnectionNotification) {
		switch n := n.(type) {
		case paho.ConnectionNotificationBrokerFailed:
			conn.set(n.Reason.Error())
		case paho.ConnectionNotificationFailed:
			conn.set(n.Reason.Error())
		case paho.ConnectionNotificationLost:
			conn.set("connection lost: " + n.Reason.Error())
		}
	}))
	log.Info("mqtt connecting", "broker", d.Broker)
	client.Connect() // retried in the background until Disconnect
	defer client.Disconnect(250)

	st := newState(d)
	var lastErr string
	publish := func() error {
		if e := conn.get(); e != lastErr {
			if e != "" {
				log.Info("mqtt broker not connected", "broker", d.Broker, "err", e)
			}
			lastErr = e
		}
		st.connErr = lastErr
		devs, sk := st.list()
		handler.SetSkipped(ctx, skipped(sk))
		return send(devs)
	}
	if err := publish(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-conn.changed:
		case m := <-msgs:
			st.handle(m.topic, m.payload)
			// Take what else has arrived before sending.
			for drained := false; !drained; {
				select {
				case m := <-msgs:
					st.handle(m.topic, m.payload)
				default:
					drained = true
				}
			}
		}
		for _, topic := range st.rebirth {
			log.Info("mqtt asking an edge node to rebirth", "topic", topic)
			client.Publish(topic, 0, false, rebirthPayload(time.Now()))
		}
		st.rebirth = st.rebirth[:0]
		if err := publish(); err != nil {
			return err
		}
	}
}

// rebirthPayload is the NCMD that asks an edge node for its births again.
func rebirthPayload(now time.Time) []byte {
	ms := uint64(now.UnixMilli())
	return sparkplug.Encode(&sparkplug.Payload{Timestamp: ms, HasTimestamp: true, Metrics: []sparkplug.Metric{{
		Name: "Node Control/Rebirth", HasName: true, Timestamp: ms, Datatype: sparkplug.Boolean, Kind: sparkplug.BoolValue, Bool: true}}})
}

func clientOptions(d *Details, creds *credentials, onConnect func(paho.Client), notify func(paho.ConnectionNotification)) *paho.ClientOptions {
	id := d.ClientID
	if id == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		id = "dowse-discovery-" + hex.EncodeToString(b)
	}
	o := paho.NewClientOptions().AddBroker(d.Broker).SetClientID(id).
		SetCleanSession(true).SetOrderMatters(true).SetKeepAlive(30 * time.Second).
		SetConnectTimeout(10 * time.Second).SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(5 * time.Second).SetMaxReconnectInterval(30 * time.Second).
		SetOnConnectHandler(onConnect).
		SetConnectionNotificationHandler(func(_ paho.Client, n paho.ConnectionNotification) { notify(n) })
	if creds.username != "" {
		o.SetUsername(creds.username)
	}
	if creds.password != "" {
		o.SetPassword(creds.password)
	}
	if creds.tls != nil {
		o.SetTLSConfig(creds.tls)
	}
	return o
}
