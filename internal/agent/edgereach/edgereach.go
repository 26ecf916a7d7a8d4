// Package edgereach decides what the cloud may reach through this node's
// link: the node's own kubelet port and the addresses of its pods, never
// another host of the edge's network (a replica that is not to be trusted
// cannot use an edge to reach its LAN). It serves the streams the cloud
// opens (link.StreamDialer), refusing others with the reason, counted.
package edgereach

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ErrRefused: the target is not this node's to reach.
var ErrRefused = errors.New("not reachable through this node")

// Reach is one node's policy and dialer.
type Reach struct {
	node    string
	nodes   client.Reader
	dialer  net.Dialer
	refused *prometheus.CounterVec
	opened  prometheus.Counter

	mu      sync.Mutex
	known   *corev1.Node // the last Node read, kept while the API is away
	fetched time.Time
}

// refreshEvery is how long a Node read serves targets before it is read
// again (pod CIDRs and addresses change rarely).
const refreshEvery = 30 * time.Second

// New is the reach of node, whose Node object nodes reads; reg receives
// its metrics (nil: not registered).
func New(node string, nodes client.Reader, reg prometheus.Registerer) *Reach {
	r := &Reach{node: node, nodes: nodes,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "edgehub", Name: "streams_refused_total",
			Help: "Streams the cloud opened that this node refused, by reason."}, []string{"reason"}),
		opened: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "edgehub", Name: "streams_opened_total",
			Help: "Streams the cloud opened that this node dialled."}),
	}
	if reg != nil {
		reg.MustRegister(r.refused, r.opened)
	}
	return r
}

// Dial connects to target when the policy allows it (a link.StreamDialer).
func (r *Reach) Dial(ctx context.Context, target string) (net.Conn, error) {
	if reason, err := r.Check(ctx, target); err != nil {
		r.refused.WithLabelValues(reason).Inc()
		return nil, err
	}
	c, err := r.dialer.DialContext(ctx, "tcp", target)
	if err != nil {
		r.refused.WithLabelValues("dial").Inc()
		return nil, err
	}
	r.opened.Inc()
	return c, nil
}

// Check says whether target ("ip:port", or the node's name and a port) is
// this node's kubelet port or an address of its pods; when not, the
// metric's reason and an error saying why.
func (r *Reach) Check(ctx context.Context, target string) (reason string, err error) {
	host, portText, err := net.SplitHostPort(target)
	if err != nil {
		return "malformed", fmt.Errorf("%w: target %q: %w", ErrRefused, target, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return "malformed", fmt.Errorf("%w: target %q has no port", ErrRefused, target)
	}
	node, err := r.nodeObject(ctx)
	if err != nil {
		return "node-unknown", fmt.Errorf("%w: node %s unknown: %w", ErrRefused, r.node, err)
	}
	kubelet := node.Status.DaemonEndpoints.KubeletEndpoint.Port
	if host == node.Name || slices.ContainsFunc(node.Status.Addresses, func(a corev1.NodeAddress) bool { return a.Address == host }) {
		if int32(port) == kubelet {
			return "", nil
		}
		return "node-port", fmt.Errorf("%w: %s is node %s's address, whose only port reachable is its kubelet's (%d)", ErrRefused, target, r.node, kubelet)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return "not-an-address", fmt.Errorf("%w: %q is neither node %s nor an address", ErrRefused, host, r.node)
	}
	cidrs := node.Spec.PodCIDRs
	if len(cidrs) == 0 && node.Spec.PodCIDR != "" {
		cidrs = []string{node.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil && p.Contains(ip.Unmap()) {
			return "", nil
		}
	}
	return "not-this-node", fmt.Errorf("%w: %s is neither node %s's kubelet nor in its pod CIDRs %v", ErrRefused, target, r.node, cidrs)
}

// nodeObject is the node's Node, read again once refreshEvery passed; the
// last one read serves while the API server cannot be reached.
func (r *Reach) nodeObject(ctx context.Context) (*corev1.Node, error) {
	r.mu.Lock()
	known, fresh := r.known, time.Since(r.fetched) < refreshEvery
	r.mu.Unlock()
	if known != nil && fresh {
		return known, nil
	}
	var n corev1.Node
	if err := r.nodes.Get(ctx, client.ObjectKey{Name: r.node}, &n); err != nil {
		if known != nil {
			return known, nil
		}
		return nil, err
	}
	r.mu.Lock()
	r.known, r.fetched = &n, time.Now()
	r.mu.Unlock()
	return &n, nil
}
