// Package devices keeps a Device for every Instance whose Configuration has
// a deviceTemplate: made from the template with the Instance's properties,
// owned by the Instance and named after it, its node one of those that see
// the device (moved to another when that node leaves), deleted with the
// Instance.
package devices

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dowse-dev/dowse/internal/apply"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	acv1alpha1 "github.com/dowse-dev/dowse/shared/api/v1alpha1/applyconfiguration/api/v1alpha1"
)

// Field managers of the Device writes. The spec is applied with force by
// FieldManager on every change (the template and the Instance own it); the
// template's desired values are applied by DefaultsManager when the Device
// is made, never again, so a desired value a person sets later (kubectl,
// dowsectl twin set) takes the field over and stays.
const (
	FieldManager    = "dowse-controller/devices"
	DefaultsManager = "dowse-controller/device-defaults"
)

// InstancesOf names the Instances of a Configuration (the cache's index).
type InstancesOf func(namespace, configuration string) ([]string, error)

// EventRecorder is what the Provisioner reports clashes with.
type EventRecorder interface {
	Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// Provisioner reconciles Instances into Devices.
type Provisioner struct {
	client    client.Client // writes, and reads the cache
	live      client.Reader // Instances as the API server has them (the cache keeps no properties)
	instances InstancesOf
	events    EventRecorder
	clashes   prometheus.Counter
	log       logr.Logger
}

// NewProvisioner makes a Provisioner; reg receives its metric (nil: none).
func NewProvisioner(c client.Client, live client.Reader, instances InstancesOf, events EventRecorder, reg prometheus.Registerer, log logr.Logger) *Provisioner {
	p := &Provisioner{client: c, live: live, instances: instances, events: events, log: log,
		clashes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "controller", Name: "device_name_clashes_total",
			Help: "Devices not made because a Device of the Instance's name exists that the Instance does not own."})}
	if reg != nil {
		reg.MustRegister(p.clashes)
	}
	return p
}

// SetupWithManager reconciles Instances, the Instances of a Configuration
// when it changes, and an Instance whose Device changed (a hand edit of the
// spec is put back).
func (p *Provisioner) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("devices").
		For(&v1alpha1.Instance{}).
		Watches(&v1alpha1.Configuration{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			names, err := p.instances(o.GetNamespace(), o.GetName())
			if err != nil {
				p.log.Error(err, "listing a configuration's instances", "configuration", o.GetNamespace()+"/"+o.GetName())
				return nil
			}
			out := make([]reconcile.Request, len(names))
			for i, n := range names {
				out[i].NamespacedName = types.NamespacedName{Namespace: o.GetNamespace(), Name: n}
			}
			return out
		})).
		Watches(&v1alpha1.Device{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &v1alpha1.Instance{}, handler.OnlyControllerOwner())).
		Complete(p)
}

// Reconcile makes, updates or deletes the Instance's Device. Idempotent.
func (p *Provisioner) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var existing v1alpha1.Device
	err := p.client.Get(ctx, req.NamespacedName, &existing)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	have := err == nil

	var inst v1alpha1.Instance
	if err := p.client.Get(ctx, req.NamespacedName, &inst); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, p.deleteOwned(ctx, &existing, have, "")
	}
	var cfg v1alpha1.Configuration
	err = p.client.Get(ctx, types.NamespacedName{Namespace: inst.Namespace, Name: inst.Spec.ConfigurationName}, &cfg)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if err != nil || cfg.Spec.DeviceTemplate == nil || inst.DeletionTimestamp != nil {
		return reconcile.Result{}, p.deleteOwned(ctx, &existing, have, inst.UID)
	}
	if !have {
		// The cache may not show a Device made a moment ago (by a person,
		// just before the Instance): the apply below forces ownership, and
		// would take it over. Ask the API server before making one.
		err := p.live.Get(ctx, req.NamespacedName, &existing)
		if err != nil && !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		have = err == nil
	}
	if have && !metav1.IsControlledBy(&existing, &inst) {
		p.clashes.Inc()
		p.log.Info("a Device of the Instance's name exists and is not the Instance's: leaving it", "device", req.String())
		p.events.Eventf(&inst, &existing, "Warning", "DeviceNameTaken", "Provision",
			"Device %s exists and is not this Instance's: no twin is made for the device", existing.Name)
		return reconcile.Result{}, nil
	}
	// The cache keeps no properties: read them where ${NAME} needs them.
	var full v1alpha1.Instance
	if err := p.live.Get(ctx, req.NamespacedName, &full); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	node := pickNode(&full, existing.Spec.NodeName)
	if node == "" && have {
		node = existing.Spec.NodeName
	}
	dev, err := FromTemplate(&full, &cfg, node)
	if err != nil {
		p.events.Eventf(&inst, nil, "Warning", "DeviceTemplateInvalid", "Provision", "%v", err)
		return reconcile.Result{}, nil
	}
	defaults := dev.DeepCopy()
	for i := range dev.Spec.Properties {
		dev.Spec.Properties[i].Desired = nil
	}
	if have && upToDate(&existing, dev) {
		// Most Instance events (slots, the nodes' views) change nothing
		// here: no write for them.
		return reconcile.Result{}, nil
	}
	if err := p.apply(ctx, dev, FieldManager, false); err != nil {
		return reconcile.Result{}, err
	}
	if !have {
		// The template's desired values, once, under their own manager.
		if err := p.apply(ctx, defaults, DefaultsManager, true); err != nil {
			return reconcile.Result{}, err
		}
	}
	if have && existing.Spec.NodeName != node {
		p.log.Info("moved a device twin to another node", "device", req.String(), "from", existing.Spec.NodeName, "to", node)
	}
	return reconcile.Result{}, nil
}

// upToDate says whether existing already holds what applying want (whose
// desired values are stripped) would state: its spec but for desired
// values (a person's or the defaults manager's), its labels and its owner.
// A false "no" only costs a redundant apply.
func upToDate(existing, want *v1alpha1.Device) bool {
	have := existing.Spec.DeepCopy()
	for i := range have.Properties {
		have.Properties[i].Desired = nil
	}
	a, errA := json.Marshal(have)
	b, errB := json.Marshal(&want.Spec)
	if errA != nil || errB != nil || !bytes.Equal(a, b) {
		return false
	}
	for k, v := range want.Labels {
		if existing.Labels[k] != v {
			return false
		}
	}
	owner := metav1.GetControllerOf(existing)
	return owner != nil && owner.UID == want.OwnerReferences[0].UID
}

// pickNode keeps current while the Instance lists it, else takes the first
// node (by name) that sees the device; "" when none does.
func pickNode(inst *v1alpha1.Instance, current string) string {
	var names []string
	for _, n := range inst.Status.Nodes {
		if n.Name == current {
			return current
		}
		names = append(names, n.Name)
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	return names[0]
}

// deleteOwned deletes d when an Instance (uid, or any when empty) controls
// it; the UID precondition keeps a Device made anew meanwhile.
func (p *Provisioner) deleteOwned(ctx context.Context, d *v1alpha1.Device, have bool, uid types.UID) error {
	if !have {
		return nil
	}
	owner := metav1.GetControllerOf(d)
	if owner == nil || owner.Kind != "Instance" || owner.APIVersion != v1alpha1.GroupVersion.String() || (uid != "" && owner.UID != uid) {
		return nil
	}
	err := p.client.Delete(ctx, d, client.Preconditions{UID: ptr.To(d.UID)})
	if err == nil {
		p.log.Info("deleted the device twin of an instance", "device", d.Namespace+"/"+d.Name)
	}
	return client.IgnoreNotFound(err)
}

// apply server-side-applies dev's metadata and spec (with only the desired
// values in the spec when withDesired) under manager, forcing ownership.
func (p *Provisioner) apply(ctx context.Context, dev *v1alpha1.Device, manager string, withDesired bool) error {
	ac := acv1alpha1.Device(dev.Name, dev.Namespace)
	if err := apply.FromObject(dev, ac); err != nil {
		return err
	}
	ac.Status = nil
	if withDesired {
		// Only the desired values: the spec's other fields are FieldManager's.
		var props []*acv1alpha1.DevicePropertyApplyConfiguration
		for _, pr := range dev.Spec.Properties {
			if pr.Desired != nil {
				props = append(props, acv1alpha1.DeviceProperty().WithName(pr.Name).WithDesired(acv1alpha1.TwinProperty().WithValue(pr.Desired.Value)))
			}
		}
		if len(props) == 0 {
			return nil
		}
		ac.Spec = acv1alpha1.DeviceSpec().WithDeviceModelRef(corev1.LocalObjectReference{Name: dev.Spec.DeviceModelRef.Name}).WithProperties(props...)
	}
	return p.client.Apply(ctx, ac, client.FieldOwner(manager), client.ForceOwnership)
}

// FromTemplate is the Device the Instance's Configuration asks for, on node:
// ${NAME} in string values of configData and desired values replaced by
// the Instance's broker property NAME (unknown names stay as written).
func FromTemplate(inst *v1alpha1.Instance, cfg *v1alpha1.Configuration, node string) (*v1alpha1.Device, error) {
	t := cfg.Spec.DeviceTemplate
	expand := func(s string) string {
		return os.Expand(s, func(k string) string {
			if v, ok := inst.Spec.BrokerProperties[k]; ok {
				return v
			}
			return "${" + k + "}"
		})
	}
	d := &v1alpha1.Device{
		ObjectMeta: metav1.ObjectMeta{
			Name: inst.Name, Namespace: inst.Namespace,
			Labels: map[string]string{
				v1alpha1.LabelConfiguration: v1alpha1.LabelValue(cfg.Name),
				v1alpha1.LabelInstance:      v1alpha1.LabelValue(inst.Name),
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "Instance", Name: inst.Name, UID: inst.UID, Controller: ptr.To(true),
			}},
		},
		Spec: v1alpha1.DeviceSpec{
			DeviceModelRef: t.DeviceModelRef.DeepCopy(),
			NodeName:       node,
			MapperName:     cfg.Name,
			Protocol:       *t.Protocol.DeepCopy(),
			Methods:        slices.Clone(t.Methods),
			StateReport:    t.StateReport.DeepCopy(),
		},
	}
	var err error
	if d.Spec.Protocol.ConfigData, err = expandJSON(d.Spec.Protocol.ConfigData, expand); err != nil {
		return nil, fmt.Errorf("deviceTemplate.protocol.configData: %w", err)
	}
	for _, tp := range t.Properties {
		pr := *tp.DeepCopy()
		if pr.Desired != nil {
			pr.Desired.Value = expand(pr.Desired.Value)
		}
		if pr.Visitors != nil {
			if pr.Visitors.ConfigData, err = expandJSON(pr.Visitors.ConfigData, expand); err != nil {
				return nil, fmt.Errorf("deviceTemplate property %s visitors: %w", pr.Name, err)
			}
		}
		d.Spec.Properties = append(d.Spec.Properties, pr)
	}
	return d, nil
}

func expandJSON(j *apiextensionsv1.JSON, expand func(string) string) (*apiextensionsv1.JSON, error) {
	if j == nil || len(j.Raw) == 0 {
		return j, nil
	}
	var v any
	if err := json.Unmarshal(j.Raw, &v); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(walk(v, expand))
	if err != nil {
		return nil, err
	}
	return &apiextensionsv1.JSON{Raw: raw}, nil
}

func walk(v any, expand func(string) string) any {
	switch x := v.(type) {
	case string:
		return expand(x)
	case map[string]any:
		for k, e := range x {
			x[k] = walk(e, expand)
		}
	case []any:
		for i, e := range x {
			x[i] = walk(e, expand)
		}
	}
	return v
}
