// Package mappers runs the mapper a Configuration's deviceTemplate names
// (KubeEdge's mapper, serving twins over DMI): one Pod per node that owns
// Devices of the Configuration, not per Instance as the brokerSpec's
// workloads of internal/controller/brokers are, pinned
// to that node, with the node's state directory mounted (where the agent's
// dmi.sock is) and the Configuration's name as its registration name, so
// the agent hands it exactly those Devices. A node that owns none of them
// any more loses its Pod.
//
// A mapper that opens its device (a Modbus RTU controller on a serial port
// the udev handler found) gets it the way brokers do, through the
// Instance's device, not a privileged hostPath: for each of its Devices
// whose Instance has device nodes or mounts, the Pod asks for one slot of
// the Instance (its extended resource; a ResourceClaim from the Instance's
// ResourceClaimTemplate when the Configuration's allocation is DRA), so the
// agent's CDI spec puts the device node in the container. Such a Pod is
// replaced delete-first (a new one would wait for the slot the old one
// holds), and its set of Devices is part of its spec.
package mappers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dowse-dev/dowse/internal/controller/brokers"
	"github.com/dowse-dev/dowse/internal/nodepaths"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Labels and environment of mapper Pods.
const (
	// LabelMapper marks a mapper Pod; its value is "true". Mapper Pods also
	// carry the Configuration and node labels of broker Pods.
	LabelMapper = v1alpha1.LabelMapper
	// EnvMapperName is the registration name a mapper takes
	// (MapperInfo.name); EnvStateDir the agent's state directory.
	EnvMapperName = nodepaths.MapperNameEnv
	EnvStateDir   = nodepaths.StateDirEnv
	// DefaultStateDir is the agent's default state directory.
	DefaultStateDir = nodepaths.DefaultStateDir
	// SinkSecretsDir is where a mapper Pod gets, read-only, each Secret
	// its Devices' pushMethods name (secretRef), one directory per Secret:
	// where the mapper SDK looks by default.
	SinkSecretsDir = nodepaths.SinkSecretsDir
)

// PodsOf lists the cached Pods (metadata only) with the Configuration label
// value in a namespace.
type PodsOf func(namespace, configurationLabel string) ([]client.Object, error)

// Reconciler keeps each Configuration's mapper Pods.
type Reconciler struct {
	client   client.Client
	pods     PodsOf
	stateDir string
	// socketGroup owns the agents' socket folders (0: none).
	socketGroup int64
	log         logr.Logger
}

// NewReconciler makes a Reconciler; stateDir is the agents' state directory
// on the nodes (DefaultStateDir when empty).
func NewReconciler(c client.Client, pods PodsOf, stateDir string, socketGroup int64, log logr.Logger) *Reconciler {
	if stateDir == "" {
		stateDir = DefaultStateDir
	}
	return &Reconciler{client: c, pods: pods, stateDir: stateDir, socketGroup: socketGroup, log: log}
}

// SetupWithManager reconciles Configurations, the Configuration a Device
// asks a mapper of (spec.mapperName) when the Device changes, and an
// Instance's Configuration when the Instance changes;
// podType is the cache's Pod type (the controller caches Pods as
// metadata).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, podType client.Object) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("mappers").
		For(&v1alpha1.Configuration{}).
		Watches(&v1alpha1.Device{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			d, ok := o.(*v1alpha1.Device)
			if !ok || d.Spec.MapperName == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: d.Namespace, Name: d.Spec.MapperName}}}
		})).
		// An Instance's device nodes, mounts and nodes shape the Pods of
		// its Configuration's mapper (a Pod asks for the devices it opens):
		// a Pod made before they were known is made again.
		Watches(&v1alpha1.Instance{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			inst, ok := o.(*v1alpha1.Instance)
			if !ok || inst.Spec.ConfigurationName == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: inst.Namespace, Name: inst.Spec.ConfigurationName}}}
		})).
		Watches(podType, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &v1alpha1.Configuration{}, handler.OnlyControllerOwner())).
		Complete(r)
}

// Reconcile makes one mapper Pod per node owning the Configuration's
// Devices and deletes the others. Idempotent.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var cfg v1alpha1.Configuration
	if err := r.client.Get(ctx, req.NamespacedName, &cfg); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, r.prune(ctx, req.Namespace, v1alpha1.LabelValue(req.Name), nil)
	}
	want := map[string]bool{}
	secrets := map[string]bool{}
	// local holds, by node, the Instances whose device the node's mapper
	// opens (device nodes or mounts), sorted.
	local := map[string][]*v1alpha1.Instance{}
	var spec *corev1.PodSpec
	if t := cfg.Spec.DeviceTemplate; t != nil && t.MapperPodSpec != nil && cfg.DeletionTimestamp == nil {
		spec = t.MapperPodSpec
		var devs v1alpha1.DeviceList
		if err := r.client.List(ctx, &devs, client.InNamespace(cfg.Namespace), client.MatchingLabels{v1alpha1.LabelConfiguration: v1alpha1.LabelValue(cfg.Name)}); err != nil {
			return reconcile.Result{}, err
		}
		for _, d := range devs.Items {
			if d.Spec.NodeName == "" || d.Spec.MapperName != cfg.Name {
				continue
			}
			want[d.Spec.NodeName] = true
			for _, p := range d.Spec.Properties {
				if pm := p.PushMethod; pm != nil && pm.SecretRef != nil && pm.SecretRef.Name != "" {
					secrets[pm.SecretRef.Name] = true
				}
			}
			owner := metav1.GetControllerOf(&d)
			if owner == nil || owner.Kind != "Instance" {
				continue
			}
			var inst v1alpha1.Instance
			if err := r.client.Get(ctx, types.NamespacedName{Namespace: d.Namespace, Name: owner.Name}, &inst); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return reconcile.Result{}, err
			}
			if inst.UID == owner.UID && inst.HasNode(d.Spec.NodeName) && (len(inst.Spec.DeviceSpecs) > 0 || len(inst.Spec.Mounts) > 0) {
				local[d.Spec.NodeName] = append(local[d.Spec.NodeName], &inst)
			}
		}
	}
	if err := r.prune(ctx, cfg.Namespace, v1alpha1.LabelValue(cfg.Name), want); err != nil {
		return reconcile.Result{}, err
	}
	if spec == nil {
		return reconcile.Result{}, nil
	}
	have, err := r.current(cfg.Namespace, v1alpha1.LabelValue(cfg.Name))
	if err != nil {
		return reconcile.Result{}, err
	}
	terminating, err := r.terminating(cfg.Namespace, v1alpha1.LabelValue(cfg.Name))
	if err != nil {
		return reconcile.Result{}, err
	}
	nodes := make([]string, 0, len(want))
	for n := range want {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	secretNames := make([]string, 0, len(secrets))
	for n := range secrets {
		secretNames = append(secretNames, n)
	}
	slices.Sort(secretNames)
	var result reconcile.Result
	for _, node := range nodes {
		insts := local[node]
		slices.SortFunc(insts, func(a, b *v1alpha1.Instance) int { return strings.Compare(a.Name, b.Name) })
		if err := r.ensureClaimTemplates(ctx, &cfg, insts); err != nil {
			return reconcile.Result{}, err
		}
		pod, err := r.podWithDevices(&cfg, spec, node, insts, secretNames)
		if err != nil {
			return reconcile.Result{}, err
		}
		var others []client.Object
		for name, old := range have {
			if old.GetAnnotations()[annotationNode] != node {
				continue
			}
			if name != pod.Name || ended(old) {
				others = append(others, old)
			}
		}
		if len(others) > 0 || terminating[node] {
			// One mapper Pod per node at a time: the old one may hold the
			// devices the new one asks for, the host ports of a hostNetwork
			// template, and the mapper's name on the agent's DMI socket
			// (which refuses a second live process of that name). It goes
			// first, and the new one comes once it is gone (its deletion
			// brings a Reconcile; the requeue is for a missed one). A
			// mapper Pod that ended (the kubelet refused it, or it was
			// evicted) is made again the same way.
			for _, old := range others {
				if err := r.delete(ctx, old); err != nil {
					return reconcile.Result{}, err
				}
			}
			result.RequeueAfter = 5 * time.Second
			continue
		}
		if _, ok := have[pod.Name]; !ok {
			if err := r.client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
				return reconcile.Result{}, fmt.Errorf("creating mapper pod for node %s: %w", node, err)
			}
			r.log.Info("created mapper pod", "configuration", req.String(), "node", node, "pod", pod.Name, "devices", len(insts))
		}
	}
	return result, nil
}

// ended says whether a mapper Pod's containers will not run again: a
// mapper serves until it is deleted, so one that ended is replaced.
func ended(o client.Object) bool {
	p, ok := o.(*brokers.BrokerPod)
	return ok && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded)
}

// terminating says which nodes have a mapper Pod of the Configuration
// that is being deleted.
func (r *Reconciler) terminating(ns, cfgLabel string) (map[string]bool, error) {
	objs, err := r.pods(ns, cfgLabel)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, o := range objs {
		if o.GetLabels()[LabelMapper] == "true" && o.GetDeletionTimestamp() != nil {
			out[o.GetAnnotations()[annotationNode]] = true
		}
	}
	return out, nil
}

// ensureClaimTemplates makes the ResourceClaimTemplates of insts when the
// Configuration's devices are claimed through DRA (brokers make them too;
// creating one that exists is no error).
func (r *Reconciler) ensureClaimTemplates(ctx context.Context, cfg *v1alpha1.Configuration, insts []*v1alpha1.Instance) error {
	if cfg.Spec.Allocation != v1alpha1.AllocationDRA {
		return nil
	}
	for _, inst := range insts {
		if err := r.client.Create(ctx, brokers.ClaimTemplate(inst)); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("claim template of Instance %s: %w", inst.Name, err)
		}
	}
	return nil
}

// podWithDevices is the mapper Pod of node, whose first container asks for
// one slot of each of insts: the Instance's extended resource, or, with
// allocation DRA, a claim from its ResourceClaimTemplate.
func (r *Reconciler) podWithDevices(cfg *v1alpha1.Configuration, spec *corev1.PodSpec, node string, insts []*v1alpha1.Instance, secrets []string) (*corev1.Pod, error) {
	if len(insts) == 0 || len(spec.Containers) == 0 {
		return r.pod(cfg, spec, node, secrets)
	}
	s := spec.DeepCopy()
	c := &s.Containers[0]
	for _, inst := range insts {
		if cfg.Spec.Allocation == v1alpha1.AllocationDRA {
			name := "dowse-" + v1alpha1.InstanceHash(inst.Name)
			s.ResourceClaims = append(s.ResourceClaims, corev1.PodResourceClaim{Name: name, ResourceClaimTemplateName: ptr.To(brokers.ClaimTemplateName(inst.Name))})
			c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: name})
			continue
		}
		if c.Resources.Limits == nil {
			c.Resources.Limits = corev1.ResourceList{}
		}
		c.Resources.Limits[corev1.ResourceName(inst.ResourceName())] = resource.MustParse("1")
	}
	return r.pod(cfg, s, node, secrets)
}

// current are the Configuration's mapper Pods, by name.
func (r *Reconciler) current(ns, cfgLabel string) (map[string]client.Object, error) {
	objs, err := r.pods(ns, cfgLabel)
	if err != nil {
		return nil, err
	}
	out := map[string]client.Object{}
	for _, o := range objs {
		// A terminating Pod is gone as far as this is concerned.
		if o.GetLabels()[LabelMapper] == "true" && o.GetDeletionTimestamp() == nil {
			out[o.GetName()] = o
		}
	}
	return out, nil
}

// prune deletes the mapper Pods of nodes not in keep.
func (r *Reconciler) prune(ctx context.Context, ns, cfgLabel string, keep map[string]bool) error {
	have, err := r.current(ns, cfgLabel)
	if err != nil {
		return err
	}
	for _, o := range have {
		if keep[o.GetAnnotations()[annotationNode]] {
			continue
		}
		if err := r.delete(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

func (r *Reconciler) delete(ctx context.Context, o client.Object) error {
	err := r.client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: o.GetNamespace(), Name: o.GetName()}}, client.Preconditions{UID: ptr.To(o.GetUID())})
	if client.IgnoreNotFound(err) != nil {
		return err
	}
	r.log.Info("deleted mapper pod", "pod", o.GetNamespace()+"/"+o.GetName())
	return nil
}

// annotationNode holds the node's full name (the node label may be cut).
const annotationNode = "dowse.dev/node-name"

// PodName is the mapper Pod of a Configuration on a node, for a spec hash.
func PodName(cfg, node, specHash string) string {
	sum := sha256.Sum256([]byte(node))
	name := cfg
	if len(name) > 200 {
		name = name[:200]
	}
	return name + "-mapper-" + hex.EncodeToString(sum[:])[:10] + "-" + specHash[:6]
}

// pod is the mapper Pod of cfg on node; secrets are the Secrets its
// Devices' pushMethods name, each mounted under SinkSecretsDir (optional:
// a missing one is the Device's Valid condition's to report, and the
// kubelet mounts it once it exists).
func (r *Reconciler) pod(cfg *v1alpha1.Configuration, spec *corev1.PodSpec, node string, secrets []string) (*corev1.Pod, error) {
	s := spec.DeepCopy()
	s.NodeName = node
	brokers.StayThroughCuts(s)
	// The agent's DMI socket folder alone: the rest of its state directory
	// (the node's link key, its edge store) is none of a mapper's business.
	const vol = "dowse-dmi"
	dmiDir := nodepaths.DMIDir(r.stateDir)
	s.Volumes = append(s.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: dmiDir, Type: ptr.To(corev1.HostPathDirectory)}}})
	mounts := []corev1.VolumeMount{{Name: vol, MountPath: dmiDir}}
	if r.socketGroup > 0 {
		// A template's non-root user may then use the folder's sockets.
		if s.SecurityContext == nil {
			s.SecurityContext = &corev1.PodSecurityContext{}
		}
		if !slices.Contains(s.SecurityContext.SupplementalGroups, r.socketGroup) {
			s.SecurityContext.SupplementalGroups = append(s.SecurityContext.SupplementalGroups, r.socketGroup)
		}
	}
	for _, name := range secrets {
		sum := sha256.Sum256([]byte(name))
		v := "dowse-sink-" + hex.EncodeToString(sum[:])[:12]
		s.Volumes = append(s.Volumes, corev1.Volume{Name: v, VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: name, Optional: ptr.To(true)}}})
		mounts = append(mounts, corev1.VolumeMount{Name: v, MountPath: SinkSecretsDir + "/" + name, ReadOnly: true})
	}
	for i := range s.Containers {
		c := &s.Containers[i]
		c.VolumeMounts = append(c.VolumeMounts, mounts...)
		c.Env = append(c.Env, corev1.EnvVar{Name: EnvStateDir, Value: r.stateDir}, corev1.EnvVar{Name: EnvMapperName, Value: cfg.Name})
	}
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	hash := hex.EncodeToString(sum[:8])
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: PodName(cfg.Name, node, hash), Namespace: cfg.Namespace,
			Labels: map[string]string{
				v1alpha1.LabelConfiguration: v1alpha1.LabelValue(cfg.Name),
				v1alpha1.LabelNode:          v1alpha1.LabelValue(node),
				LabelMapper:                 "true",
			},
			Annotations: map[string]string{v1alpha1.AnnotationSpecHash: hash, annotationNode: node},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Configuration",
				Name: cfg.Name, UID: cfg.UID, Controller: ptr.To(true)}},
		},
		Spec: *s,
	}, nil
}
