// Package events records Kubernetes Events (events.k8s.io/v1) through a
// bounded queue and a few senders, and keeps nothing once an event is sent.
// client-go's events broadcaster keeps every event it sent for six minutes
// to spot series: a burst of 10,000 broker creations held 12 MB there, the
// largest part of the controller's memory after its caches.
package events

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	eventsclient "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/tools/reference"
)

// Recorder is a controller-runtime recorder.EventRecorder. Events are best
// effort, as everywhere in Kubernetes: when the queue is full (the API
// server slower than the controller), an event is dropped and counted.
type Recorder struct {
	client     eventsclient.EventsV1Interface
	scheme     *runtime.Scheme
	controller string
	instance   string
	queue      chan *eventsv1.Event
	sent       prometheus.Counter
	dropped    prometheus.Counter
	now        func() time.Time
}

// New makes a Recorder reporting as controller; queue bounds the events
// waiting to be sent. reg receives its counters, named
// <metricPrefix>_events_sent_total and _dropped_total (nil: not
// registered).
func New(client eventsclient.EventsV1Interface, scheme *runtime.Scheme, controller, metricPrefix string, queue int, reg prometheus.Registerer) *Recorder {
	host, _ := os.Hostname()
	r := &Recorder{
		client: client, scheme: scheme, controller: controller, instance: controller + "-" + host,
		queue: make(chan *eventsv1.Event, queue), now: time.Now,
		sent:    prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "_events_sent_total", Help: "Events written to the API server."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: metricPrefix + "_events_dropped_total", Help: "Events dropped: the queue was full, the object had no reference, or the API server refused them."}),
	}
	if reg != nil {
		reg.MustRegister(r.sent, r.dropped)
	}
	return r
}

// Eventf queues an event about regarding (and related, if not nil). It
// never blocks.
func (r *Recorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.AnnotatedEventf(regarding, related, nil, eventtype, reason, action, note, args...)
}

// AnnotatedEventf is Eventf with annotations on the Event.
func (r *Recorder) AnnotatedEventf(regarding, related runtime.Object, annotations map[string]string, eventtype, reason, action, note string, args ...any) {
	ref, err := reference.GetReference(r.scheme, regarding)
	if err != nil {
		r.dropped.Inc()
		return
	}
	var rel *corev1.ObjectReference
	if related != nil {
		if rel, err = reference.GetReference(r.scheme, related); err != nil {
			rel = nil // the event is still worth having without it
		}
	}
	now := r.now()
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", ref.Name, now.UnixNano()), Namespace: ns, Annotations: annotations},
		EventTime:  metav1.NewMicroTime(now), ReportingController: r.controller, ReportingInstance: r.instance,
		Action: action, Reason: reason, Regarding: *ref, Related: rel, Note: fmt.Sprintf(note, args...), Type: eventtype,
	}
	select {
	case r.queue <- ev:
	default:
		r.dropped.Inc()
	}
}

// senders write events in parallel: one at a time, a burst of broker
// creations outran a single sender and most of its events were dropped.
const senders = 8

// Start sends queued events until ctx ends.
func (r *Recorder) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("events")
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case ev := <-r.queue:
					r.send(ctx, log, ev)
				}
			}
		})
	}
	wg.Wait()
	return nil
}

func (r *Recorder) send(ctx context.Context, log logr.Logger, ev *eventsv1.Event) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := r.client.Events(ev.Namespace).Create(cctx, ev, metav1.CreateOptions{}); err != nil {
		r.dropped.Inc()
		log.V(1).Info("event not recorded", "reason", ev.Reason, "regarding", ev.Regarding.Name, "err", err)
		return
	}
	r.sent.Inc()
}

// NeedLeaderElection is false: every replica's reconcilers may record.
func (r *Recorder) NeedLeaderElection() bool { return false }
