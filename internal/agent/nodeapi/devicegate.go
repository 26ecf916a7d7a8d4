package nodeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dowse-dev/dowse/internal/agent/slots"
)

// A kubelet that starts after a reboot admits every pod of its node at
// once, and rejects for good (UnexpectedAdmissionError) a pod whose device
// plugin resources no plugin serves yet: the agent, which serves them, is
// one of the pods it is starting. Online the cloud makes such a pod again;
// offline nothing would. So while offline, the proxy hands the kubelet a
// pod that asks for such resources only once the kubelet lists enough of
// their devices as allocatable (its pod-resources API): left out of the
// pods it lists, then added on its held pod watches.

// deviceGate holds back pods until their devices are served.
type deviceGate struct {
	socket string
	prefix string

	mu sync.Mutex
	// pending are pods left out of a list, by UID.
	pending map[string]gatedPod
	// released are pods let through since, for watches to add.
	released map[string]gatedPod
	// changed is closed when released grows.
	changed chan struct{}
}

type gatedPod struct {
	identity string
	raw      json.RawMessage
	needs    map[string]int64
}

func newDeviceGate(socket, prefix string) *deviceGate {
	return &deviceGate{socket: socket, prefix: prefix, pending: map[string]gatedPod{}, released: map[string]gatedPod{}, changed: make(chan struct{})}
}

// needs is what a pod asks of the gated resources.
func (g *deviceGate) needs(raw json.RawMessage) (string, map[string]int64) {
	var pod corev1.Pod
	if err := json.Unmarshal(raw, &pod); err != nil {
		return "", nil
	}
	out := map[string]int64{}
	add := func(cs []corev1.Container, largest bool) {
		for _, c := range cs {
			for name, q := range c.Resources.Limits {
				if !strings.HasPrefix(string(name), g.prefix) {
					continue
				}
				if largest {
					out[string(name)] = max(out[string(name)], q.Value())
				} else {
					out[string(name)] += q.Value()
				}
			}
		}
	}
	add(pod.Spec.Containers, false)
	add(pod.Spec.InitContainers, true)
	if len(out) == 0 {
		return string(pod.UID), nil
	}
	return string(pod.UID), out
}

// admitter is admit over one reading of what the kubelet can allocate,
// taken before a list is read from the store (not under its lock, and once
// for all of the list's pods).
func (g *deviceGate) admitter(ctx context.Context, identity string) func(json.RawMessage) bool {
	have, err := g.allocatable(ctx)
	if err != nil {
		have = nil // nothing allocatable known: every pod with devices waits
	}
	return func(raw json.RawMessage) bool { return g.admit(identity, raw, have) }
}

// admit says whether a pod may be listed now, given what the kubelet can
// allocate; one that may not is kept to be released later.
func (g *deviceGate) admit(identity string, raw json.RawMessage, have map[string]int64) bool {
	uid, needs := g.needs(raw)
	if len(needs) == 0 {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.released[uid]; ok {
		return true
	}
	if satisfied(needs, have) {
		return true
	}
	g.pending[uid] = gatedPod{identity: identity, raw: raw, needs: needs}
	return false
}

func satisfied(needs, have map[string]int64) bool {
	for r, n := range needs {
		if have[r] < n {
			return false
		}
	}
	return true
}

// allocatable counts the devices the kubelet can allocate, by resource.
func (g *deviceGate) allocatable(ctx context.Context) (map[string]int64, error) {
	var resp *podresources.AllocatableResourcesResponse
	if err := slots.WithPodResources(ctx, g.socket, 2*time.Second, func(ctx context.Context, c podresources.PodResourcesListerClient) error {
		var err error
		resp, err = c.GetAllocatableResources(ctx, &podresources.AllocatableResourcesRequest{})
		return err
	}); err != nil {
		return nil, fmt.Errorf("the kubelet's allocatable devices: %w", err)
	}
	out := map[string]int64{}
	for _, d := range resp.Devices {
		out[d.ResourceName] += int64(len(d.DeviceIds))
	}
	return out, nil
}

// release lets through the pending pods whose devices are there now.
func (g *deviceGate) release(ctx context.Context) int {
	g.mu.Lock()
	n := len(g.pending)
	g.mu.Unlock()
	if n == 0 {
		return 0
	}
	have, err := g.allocatable(ctx)
	if err != nil {
		return 0
	}
	return g.releaseSatisfied(have)
}

// releaseSatisfied lets through the pending pods have satisfies.
func (g *deviceGate) releaseSatisfied(have map[string]int64) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	freed := 0
	for uid, p := range g.pending {
		if satisfied(p.needs, have) {
			delete(g.pending, uid)
			g.released[uid] = p
			freed++
		}
	}
	if freed > 0 {
		close(g.changed)
		g.changed = make(chan struct{})
	}
	return freed
}

// releasedSince returns the released pods of identity not in sent, and a
// channel closed when more are released.
func (g *deviceGate) releasedSince(identity string, sent map[string]bool) ([]json.RawMessage, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []json.RawMessage
	for uid, p := range g.released {
		if p.identity == identity && !sent[uid] {
			sent[uid] = true
			out = append(out, p.raw)
		}
	}
	return out, g.changed
}

// reset forgets everything: the API server answers again.
func (g *deviceGate) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.pending)
	clear(g.released)
}

// run releases pods as their devices appear, until ctx ends.
func (g *deviceGate) run(ctx context.Context) {
	wait.UntilWithContext(ctx, func(ctx context.Context) { g.release(ctx) }, 500*time.Millisecond)
}
