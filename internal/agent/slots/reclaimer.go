package slots

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// DefaultPodResourcesSocket is the kubelet's pod-resources API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// SlotUse is a slot as the kubelet knows it: a device id of a resource.
type SlotUse struct{ Resource, ID string }

// SlotsInUse lists the Dowse slots the kubelet has assigned to pods it
// still runs. A slot id alone names nothing: two namespaces' Instances of
// one device have the same ids, under different resources.
type SlotsInUse func(ctx context.Context) (map[SlotUse]bool, error)

// WithPodResources calls f with a client of the kubelet's pod-resources API
// at socket, on a connection of its own, within timeout.
func WithPodResources(ctx context.Context, socket string, timeout time.Duration, f func(context.Context, podresources.PodResourcesListerClient) error) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return f(ctx, podresources.NewPodResourcesListerClient(conn))
}

// PodResourcesSlots is a SlotsInUse over the kubelet's pod-resources List.
func PodResourcesSlots(socket string) SlotsInUse {
	return func(ctx context.Context) (map[SlotUse]bool, error) {
		var resp *podresources.ListPodResourcesResponse
		if err := WithPodResources(ctx, socket, 10*time.Second, func(ctx context.Context, c podresources.PodResourcesListerClient) error {
			var err error
			resp, err = c.List(ctx, &podresources.ListPodResourcesRequest{})
			return err
		}); err != nil {
			return nil, fmt.Errorf("listing pod resources: %w", err)
		}
		used := map[SlotUse]bool{}
		for _, p := range resp.PodResources {
			for _, c := range p.Containers {
				for _, d := range c.Devices {
					if strings.HasPrefix(d.ResourceName, v1alpha1.ResourcePrefix) {
						for _, id := range d.DeviceIds {
							used[SlotUse{Resource: d.ResourceName, ID: id}] = true
						}
					}
				}
			}
		}
		return used, nil
	}
}

// Reclaimer frees the slots this node holds that no pod of the kubelet has
// used for Grace: Allocate claims slots, but nothing tells a plugin that a
// pod ended. The grace covers the time between Allocate and the container
// showing in the pod-resources API, and brief gaps.
type Reclaimer struct {
	InUse    SlotsInUse
	Claimer  *Claimer
	Node     string
	Grace    time.Duration
	Interval time.Duration
	// Instances lists the Instances on this node, as last seen.
	Instances func() []*v1alpha1.Instance
	Log       logr.Logger
	// Reclaimed, when set, is told how many slots each scan freed (a
	// metric).
	Reclaimed func(n int)

	unusedSince map[slotKey]time.Time
}

// slotKey is one slot of one Instance.
type slotKey struct {
	instance types.NamespacedName
	id       string
}

// Start scans every Interval until ctx ends. A failing List (no kubelet)
// is logged and retried: it never frees anything.
func (r *Reclaimer) Start(ctx context.Context) error {
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := r.Scan(ctx, time.Now()); err != nil {
				r.Log.Error(err, "reclaiming slots")
			}
		}
	}
}

// Scan frees what has been unused for Grace at now.
func (r *Reclaimer) Scan(ctx context.Context, now time.Time) error {
	used, err := r.InUse(ctx)
	if err != nil {
		return err
	}
	if r.unusedSince == nil {
		r.unusedSince = map[slotKey]time.Time{}
	}
	// A slot held with no resource recorded (an agent before resources
	// were recorded) is in use under any.
	anyResource := map[string]bool{}
	for u := range used {
		anyResource[u.ID] = true
	}
	seen := map[slotKey]bool{}
	var errs []error
	for _, inst := range r.Instances() {
		var free []string
		for _, s := range r.Claimer.HeldSlots(inst) {
			k := slotKey{instance: client.ObjectKeyFromObject(inst), id: s.ID}
			seen[k] = true
			if used[SlotUse{Resource: s.Resource, ID: s.ID}] || (s.Resource == "" && anyResource[s.ID]) {
				delete(r.unusedSince, k)
				continue
			}
			since, ok := r.unusedSince[k]
			if !ok {
				r.unusedSince[k] = now
				continue
			}
			if now.Sub(since) >= r.Grace {
				free = append(free, s.ID)
			}
		}
		if len(free) == 0 {
			continue
		}
		if err := r.Claimer.Release(ctx, inst, free); err != nil {
			errs = append(errs, err)
			continue
		}
		r.Log.Info("slots freed", "instance", client.ObjectKeyFromObject(inst), "slots", free)
		if r.Reclaimed != nil {
			r.Reclaimed(len(free))
		}
		for _, id := range free {
			delete(r.unusedSince, slotKey{instance: client.ObjectKeyFromObject(inst), id: id})
		}
	}
	for id := range r.unusedSince {
		if !seen[id] {
			delete(r.unusedSince, id)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d Instances: %v", len(errs), errs)
	}
	return nil
}
