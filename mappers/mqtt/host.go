package mqtt

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/dowse-dev/dowse/internal/sparkplug"
)

// A Sparkplug primary host application (Sparkplug 3.0, "Sparkplug Host
// Application"): its STATE, spBv1.0/STATE/<host_id>, tells edge nodes that
// name it as their primary host whether it is there. A device's
// primaryHostId makes the mapper that host, on a connection of its own per
// broker and host id shared by every device that names it (a host is one
// MQTT session: one device's connection ending must not say the host is
// gone):
//
//   - connecting, it leaves a Will Message, retained at QoS 1:
//     {"online": false, "timestamp": T}, which the broker publishes when
//     the mapper ends without a word (a crash, kill -9, a lost network);
//   - connected (and after each reconnect), it publishes retained at QoS 1
//     {"online": true, "timestamp": T}, T the same as the will's;
//   - when the last device naming it goes, it publishes online false
//     itself, then disconnects.

// hostState is the STATE payload.
type hostState struct {
	Online    bool  `json:"online"`
	Timestamp int64 `json:"timestamp"`
}

// hostKey names a host connection: one per broker, sign-in and host id.
type hostKey struct{ broker, user, hostID string }

// hosts are a mapper's host connections (one Hosts per NewDrivers).
type hosts struct {
	mu sync.Mutex
	m  map[hostKey]*host
}

type host struct {
	client paho.Client
	refs   int
	topic  string
	ts     int64
}

// acquire returns the host connection of k, connecting it (with o, the
// device's options, its client id and will replaced) the first time.
func (hs *hosts) acquire(k hostKey, o *paho.ClientOptions, timeout time.Duration) error {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if h := hs.m[k]; h != nil {
		h.refs++
		return nil
	}
	topic := sparkplug.Namespace + "/STATE/" + k.hostID
	ts := time.Now().UnixMilli()
	will, _ := json.Marshal(hostState{Online: false, Timestamp: ts})
	birth, _ := json.Marshal(hostState{Online: true, Timestamp: ts})
	o.SetClientID(randomID()).SetCleanSession(true).SetWill(topic, string(will), 1, true).
		SetAutoReconnect(true).SetMaxReconnectInterval(30 * time.Second).
		SetOnConnectHandler(func(c paho.Client) {
			// After each (re)connect: the host is there.
			c.Publish(topic, 1, true, birth)
		})
	client := paho.NewClient(o)
	tok := client.Connect()
	if !tok.WaitTimeout(timeout + time.Second) {
		client.Disconnect(0)
		return fmt.Errorf("primary host %s: connecting to %s: no answer within %v", k.hostID, k.broker, timeout)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("primary host %s: connecting to %s: %w", k.hostID, k.broker, err)
	}
	hs.m[k] = &host{client: client, refs: 1, topic: topic, ts: ts}
	return nil
}

// release lets go of one reference; the last one says the host is gone
// (retained online false) and disconnects.
func (hs *hosts) release(k hostKey) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h := hs.m[k]
	if h == nil {
		return
	}
	if h.refs--; h.refs > 0 {
		return
	}
	delete(hs.m, k)
	off, _ := json.Marshal(hostState{Online: false, Timestamp: h.ts}) // the will's, as the specification asks
	h.client.Publish(h.topic, 1, true, off).WaitTimeout(2 * time.Second)
	h.client.Disconnect(250)
}
