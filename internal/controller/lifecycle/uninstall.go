package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// AgentFinalizerPrefix starts every agent's finalizer on a Configuration
// (v1alpha1.AgentFinalizer).
const AgentFinalizerPrefix = "agent.dowse.dev/"

// Agents finds the nodes whose agent runs: Pods in Namespace matching
// Selector (the agent DaemonSet's), running on their node.
type Agents struct {
	Reader    client.Reader
	Namespace string
	Selector  labels.Selector
}

// finalizers returns the agent finalizers of the agents that run now: a
// Pod matching the selector, bound to a node, not terminated.
func (a Agents) finalizers(ctx context.Context) (map[string]bool, error) {
	var pods corev1.PodList
	if err := a.Reader.List(ctx, &pods, client.InNamespace(a.Namespace), client.MatchingLabelsSelector{Selector: a.Selector}); err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		live[v1alpha1.AgentFinalizer(p.Spec.NodeName)] = true
	}
	return live, nil
}

// dropGone removes from every Configuration the agent finalizers for which
// gone returns true, and says how many it removed.
func dropGone(ctx context.Context, c client.Client, gone func(string) bool) (int, error) {
	var cfgs v1alpha1.ConfigurationList
	if err := c.List(ctx, &cfgs); err != nil {
		return 0, err
	}
	removed := 0
	for i := range cfgs.Items {
		cfg := &cfgs.Items[i]
		keep := slices.DeleteFunc(slices.Clone(cfg.Finalizers), func(f string) bool { return strings.HasPrefix(f, AgentFinalizerPrefix) && gone(f) })
		if len(keep) == len(cfg.Finalizers) {
			continue
		}
		// An optimistic lock: a live agent's finalizer may change meanwhile.
		patch := client.MergeFromWithOptions(cfg.DeepCopy(), client.MergeFromWithOptimisticLock{})
		removed += len(cfg.Finalizers) - len(keep)
		cfg.Finalizers = keep
		if err := c.Patch(ctx, cfg, patch); client.IgnoreNotFound(err) != nil {
			return removed, err
		}
	}
	return removed, nil
}

// UninstallOptions configure Uninstall.
type UninstallOptions struct {
	// Agents find the agents that run (their finalizers are theirs to
	// drop; the others' are dropped by Uninstall).
	Agents Agents
	// Timeout bounds the whole; 2 minutes when zero.
	Timeout time.Duration
	// KeepModels leaves DeviceModels and hand-written Devices in place.
	KeepModels bool
	// Poll is how often what is left is looked at; 1s when zero.
	Poll time.Duration
}

// Uninstall takes away everything Dowse made in the cluster before its
// agents and controller go: it deletes every Configuration (and, unless
// KeepModels, every Device and DeviceModel), lets the running agents
// release their Instances, drops the finalizers of agents that no longer
// run, and waits until no Configuration, Instance, Device, broker Pod, Job
// or Service, mapper Pod, DeviceClass or ResourceSlice of Dowse's is left.
// The CRDs stay (as Helm keeps a chart's crds/). It returns an error naming
// what is left when Timeout passes. It is idempotent.
func Uninstall(ctx context.Context, c client.Client, o UninstallOptions, log logr.Logger) error {
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	kinds := []client.Object{&v1alpha1.Configuration{}}
	if !o.KeepModels {
		kinds = append(kinds, &v1alpha1.Device{}, &v1alpha1.DeviceModel{})
	}
	for _, k := range kinds {
		if err := deleteEach(ctx, c, k); err != nil {
			return fmt.Errorf("deleting %T: %w", k, err)
		}
	}
	log.Info("deleted the Dowse objects; waiting for what they made to go")
	var left []string
	for {
		live, err := o.Agents.finalizers(ctx)
		if err == nil {
			var n int
			n, err = dropGone(ctx, c, func(f string) bool { return !live[f] })
			if n > 0 {
				log.Info("dropped finalizers of agents that no longer run", "finalizers", n)
			}
		}
		if err == nil {
			left, err = leftovers(ctx, c, o.KeepModels)
		}
		if err == nil && len(left) == 0 {
			log.Info("nothing of Dowse is left")
			return nil
		}
		if err != nil {
			log.Info("looking at what is left failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("uninstall did not finish within %v: %w", o.Timeout, err)
			}
			return fmt.Errorf("uninstall did not finish within %v; left: %s", o.Timeout, strings.Join(left, ", "))
		case <-time.After(o.Poll):
		}
	}
}

// deleteEach deletes every object of k's kind, one at a time.
func deleteEach(ctx context.Context, c client.Client, k client.Object) error {
	gvk, err := c.GroupVersionKindFor(k)
	if err != nil {
		return err
	}
	list, err := c.Scheme().New(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err != nil {
		return err
	}
	l, ok := list.(client.ObjectList)
	if !ok {
		return fmt.Errorf("%s has no list type", gvk)
	}
	if err := c.List(ctx, l); err != nil {
		return err
	}
	items, err := meta.ExtractList(l)
	if err != nil {
		return err
	}
	var errs []error
	for _, it := range items {
		if o, ok := it.(client.Object); ok {
			errs = append(errs, client.IgnoreNotFound(c.Delete(ctx, o, client.PropagationPolicy("Background"))))
		}
	}
	return errors.Join(errs...)
}

// leftovers names what Dowse made that is still there.
func leftovers(ctx context.Context, c client.Client, keepModels bool) ([]string, error) {
	var left []string
	add := func(kind string, l client.ObjectList, opts ...client.ListOption) error {
		if err := c.List(ctx, l, opts...); err != nil {
			if meta.IsNoMatchError(err) {
				return nil // resource.k8s.io not served: no slices
			}
			return err
		}
		items, err := meta.ExtractList(l)
		if err != nil {
			return err
		}
		for _, it := range items {
			if o, ok := it.(client.Object); ok {
				name := kind + " " + o.GetName()
				if o.GetNamespace() != "" {
					name = kind + " " + o.GetNamespace() + "/" + o.GetName()
				}
				if !o.GetDeletionTimestamp().IsZero() {
					name += " (terminating)"
				}
				left = append(left, name)
			}
		}
		return nil
	}
	req, err := labels.NewRequirement(v1alpha1.LabelConfiguration, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	made := client.MatchingLabelsSelector{Selector: labels.NewSelector().Add(*req)}
	type check struct {
		kind string
		list client.ObjectList
		opts []client.ListOption
	}
	checks := []check{
		{"Configuration", &v1alpha1.ConfigurationList{}, nil},
		{"Instance", &v1alpha1.InstanceList{}, nil},
		{"Pod", &corev1.PodList{}, []client.ListOption{made}},
		{"Job", &batchv1.JobList{}, []client.ListOption{made}},
		{"Service", &corev1.ServiceList{}, []client.ListOption{made}},
		{"DeviceClass", &resourcev1.DeviceClassList{}, []client.ListOption{made}},
		{"ResourceSlice", &resourcev1.ResourceSliceList{}, []client.ListOption{client.MatchingFields{"spec.driver": shareddra.DriverName}}},
	}
	if !keepModels {
		checks = append(checks, check{"Device", &v1alpha1.DeviceList{}, nil}, check{"DeviceModel", &v1alpha1.DeviceModelList{}, nil})
	}
	for _, ch := range checks {
		if err := add(ch.kind, ch.list, ch.opts...); err != nil {
			return nil, fmt.Errorf("listing %ss: %w", ch.kind, err)
		}
	}
	return left, nil
}

// LinkLeaseLabel marks the Leases the controller's replicas keep for the
// cloud/edge link (node sessions, replica presence; internal/controller/link/ownership).
const LinkLeaseLabel = "dowse.dev/link"

// AfterUninstall is the post-delete step: once no Pod of the release runs
// (the controller's replicas and the agents are gone, so nothing writes the
// link's Leases again), it deletes the link's Leases in namespace. A node's
// session Lease is owned by its Node, which outlives the release.
func AfterUninstall(ctx context.Context, c client.Client, namespace string, release labels.Selector, timeout time.Duration, log logr.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabelsSelector{Selector: release}); err != nil {
			return err
		}
		var running []string
		for _, p := range pods.Items {
			if p.Labels["app.kubernetes.io/name"] == "dowse-controller" || p.Labels["app.kubernetes.io/name"] == "dowse-agent" {
				running = append(running, p.Name)
			}
		}
		if len(running) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pods of the release still there after %v: %v", timeout, running)
		case <-time.After(time.Second):
		}
	}
	if err := c.DeleteAllOf(ctx, &coordinationv1.Lease{}, client.InNamespace(namespace), client.HasLabels{LinkLeaseLabel}); err != nil {
		return fmt.Errorf("deleting the link's Leases: %w", err)
	}
	log.Info("deleted the link's Leases")
	return nil
}
