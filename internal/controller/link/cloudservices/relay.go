package cloudservices

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/link"
)

// Relay, run by every replica that relays, listens on Host at each
// replica port the leader gave a Service, and relays each connection to a
// ready Pod of that Service through Dial (the egress: over the Pod's
// node's link, through the replica holding its session).
type Relay struct {
	// Reader reads Services and Pods (the API server).
	Reader client.Reader
	// Dial reaches host:port (egress.Server.Dial).
	Dial func(ctx context.Context, target string) (net.Conn, error)
	// Host is the address listened on, published for the EndpointSlices.
	Host string
	// Every is how often the Services are looked at again (2s).
	Every      time.Duration
	Registerer prometheus.Registerer
	Log        logr.Logger

	conns     *prometheus.CounterVec
	mu        sync.Mutex
	listeners map[int32]*listener
}

type listener struct {
	l net.Listener
	// target is the Service and its port this replica port is of.
	mu      sync.Mutex
	service types.NamespacedName
	port    int32
}

func (l *listener) get() (types.NamespacedName, int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.service, l.port
}

// Start runs until ctx ends, then closes every listener.
func (r *Relay) Start(ctx context.Context) error {
	r.conns = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloud_services", Name: "connections_total",
		Help: "Connections to cloud-side Services relayed from this replica: relayed, or refused with the reason (no-pod, unreachable)."}, []string{"result"})
	if r.Registerer != nil {
		if err := r.Registerer.Register(r.conns); err != nil {
			return err
		}
	}
	r.listeners = map[int32]*listener{}
	defer func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, l := range r.listeners {
			_ = l.l.Close()
		}
	}()
	every := r.Every
	if every <= 0 {
		every = 2 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := r.sync(ctx); err != nil && ctx.Err() == nil {
			r.Log.Error(err, "cloud-side Services")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// sync listens on the replica ports of the Services that have them and
// closes the others.
func (r *Relay) sync(ctx context.Context) error {
	var asking corev1.ServiceList
	if err := r.Reader.List(ctx, &asking, client.HasLabels{LabelReach}); err != nil {
		return fmt.Errorf("listing services labelled %s: %w", LabelReach, err)
	}
	want := map[int32]struct {
		svc  types.NamespacedName
		port int32
	}{}
	for i := range asking.Items {
		s := &asking.Items[i]
		if !reachable(s) {
			continue
		}
		for sp, rp := range ports(s) {
			want[rp] = struct {
				svc  types.NamespacedName
				port int32
			}{client.ObjectKeyFromObject(s), sp}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for rp, l := range r.listeners {
		if _, ok := want[rp]; !ok {
			_ = l.l.Close()
			delete(r.listeners, rp)
		}
	}
	var errs []error
	for rp, w := range want {
		if l, ok := r.listeners[rp]; ok {
			l.mu.Lock()
			l.service, l.port = w.svc, w.port
			l.mu.Unlock()
			continue
		}
		nl, err := net.Listen("tcp", net.JoinHostPort(r.Host, strconv.Itoa(int(rp))))
		if err != nil {
			errs = append(errs, fmt.Errorf("service %s port %d: %w", w.svc, w.port, err))
			continue
		}
		l := &listener{l: nl, service: w.svc, port: w.port}
		r.listeners[rp] = l
		r.Log.Info("relaying a cloud-side Service", "service", w.svc.String(), "port", w.port, "address", nl.Addr().String())
		go r.serve(ctx, l)
	}
	return errors.Join(errs...)
}

func (r *Relay) serve(ctx context.Context, l *listener) {
	for {
		c, err := l.l.Accept()
		if err != nil {
			return
		}
		go r.relay(ctx, l, c)
	}
}

func (r *Relay) relay(ctx context.Context, l *listener, c net.Conn) {
	svc, port := l.get()
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	target, err := r.backend(dctx, svc, port)
	if err != nil {
		cancel()
		r.conns.WithLabelValues("no-pod").Inc()
		r.Log.Info("cloud-side connection refused", "service", svc.String(), "port", port, "reason", err.Error())
		_ = c.Close()
		return
	}
	b, err := r.Dial(dctx, target)
	cancel()
	if err != nil {
		r.conns.WithLabelValues("unreachable").Inc()
		r.Log.Info("cloud-side connection refused", "service", svc.String(), "port", port, "target", target, "reason", err.Error())
		_ = c.Close()
		return
	}
	r.conns.WithLabelValues("relayed").Inc()
	link.Splice(b, c)
}

// backend is the address of a ready (else running) Pod of svc at the
// target of its port, chosen at random.
func (r *Relay) backend(ctx context.Context, key types.NamespacedName, port int32) (string, error) {
	var s corev1.Service
	if err := r.Reader.Get(ctx, key, &s); err != nil {
		return "", err
	}
	var sp *corev1.ServicePort
	for i := range s.Spec.Ports {
		if s.Spec.Ports[i].Port == port {
			sp = &s.Spec.Ports[i]
		}
	}
	if sp == nil || !reachable(&s) {
		return "", fmt.Errorf("service %s has no port %d to reach from the cloud", key, port)
	}
	var pods corev1.PodList
	if err := r.Reader.List(ctx, &pods, client.InNamespace(key.Namespace), client.MatchingLabels(s.Spec.Selector)); err != nil {
		return "", err
	}
	var ready, running []*corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || !p.DeletionTimestamp.IsZero() {
			continue
		}
		running = append(running, p)
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready = append(ready, p)
			}
		}
	}
	pick := ready
	if len(pick) == 0 {
		pick = running
	}
	if len(pick) == 0 {
		return "", fmt.Errorf("service %s selects no running Pod", key)
	}
	p := pick[rand.IntN(len(pick))] //nolint:gosec // spreading load, not a secret
	tp, err := targetPort(p, sp)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(tp))), nil
}

// targetPort is sp's targetPort on p: a number, a container port's name,
// or (unset) the Service port itself.
func targetPort(p *corev1.Pod, sp *corev1.ServicePort) (int32, error) {
	switch {
	case sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal != "":
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == sp.TargetPort.StrVal {
					return cp.ContainerPort, nil
				}
			}
		}
		return 0, fmt.Errorf("pod %s has no port named %q", p.Name, sp.TargetPort.StrVal)
	case sp.TargetPort.IntVal != 0:
		return sp.TargetPort.IntVal, nil
	}
	return sp.Port, nil
}
