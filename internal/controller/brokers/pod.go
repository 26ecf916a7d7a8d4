package brokers

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// labels are what the controller puts on everything it makes for an
// Instance; the Services select on them.
func labels(inst *v1alpha1.Instance, node string) map[string]string {
	l := map[string]string{
		v1alpha1.LabelConfiguration: v1alpha1.LabelValue(inst.Spec.ConfigurationName),
		v1alpha1.LabelInstance:      inst.Name,
	}
	if node != "" {
		l[v1alpha1.LabelNode] = v1alpha1.LabelValue(node)
	}
	return l
}

func owner(inst *v1alpha1.Instance) []metav1.OwnerReference {
	t := true
	return []metav1.OwnerReference{{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "Instance", Name: inst.Name, UID: inst.UID,
		Controller: &t, BlockOwnerDeletion: &t,
	}}
}

// withDevice returns a copy of spec that asks for one slot of the
// Instance's resource: a placeholder in requests or limits is replaced, and
// without one the first container gets the resource as a limit.
func withDevice(spec *corev1.PodSpec, inst *v1alpha1.Instance) *corev1.PodSpec {
	out := spec.DeepCopy()
	// The agent's Instance device plugin serves this resource.
	res := corev1.ResourceName(inst.ResourceName())
	one := resource.MustParse("1")
	replaced := false
	swap := func(l corev1.ResourceList) {
		for name, q := range l {
			if name == Placeholder || name == corev1.ResourceName(v1alpha1.LegacyResourceName(Placeholder)) {
				delete(l, name)
				l[res] = q
				replaced = true
			}
		}
	}
	for _, cs := range [][]corev1.Container{out.InitContainers, out.Containers} {
		for i := range cs {
			swap(cs[i].Resources.Limits)
			swap(cs[i].Resources.Requests)
		}
	}
	if !replaced && len(out.Containers) > 0 {
		c := &out.Containers[0]
		if c.Resources.Limits == nil {
			c.Resources.Limits = corev1.ResourceList{}
		}
		c.Resources.Limits[res] = one
	}
	return out
}

// StayThroughCuts makes spec tolerate its node being unreachable or not
// ready for as long as it lasts, as a DaemonSet's Pods do: a Pod bound to
// one node's device is no use anywhere else, and an edge node cut off from
// the cloud keeps running it (the default, 300 s, would have the cloud
// delete it and make it again after every longer cut). A template's own
// toleration of these taints is kept.
func StayThroughCuts(spec *corev1.PodSpec) {
	for _, taint := range []string{corev1.TaintNodeUnreachable, corev1.TaintNodeNotReady} {
		if !slices.ContainsFunc(spec.Tolerations, func(t corev1.Toleration) bool {
			return t.Key == taint && (t.Effect == "" || t.Effect == corev1.TaintEffectNoExecute)
		}) {
			spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Key: taint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})
		}
	}
}

// pinned returns a copy of spec that can only run on node, and stays there
// through cuts (StayThroughCuts).
func pinned(spec *corev1.PodSpec, node string) *corev1.PodSpec {
	out := spec.DeepCopy()
	StayThroughCuts(out)
	term := corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{
		Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node},
	}}}
	if out.Affinity == nil {
		out.Affinity = &corev1.Affinity{}
	}
	if out.Affinity.NodeAffinity == nil {
		out.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := out.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	sel := na.RequiredDuringSchedulingIgnoredDuringExecution
	if len(sel.NodeSelectorTerms) == 0 {
		sel.NodeSelectorTerms = []corev1.NodeSelectorTerm{term}
	} else {
		// Terms are ORed: the node requirement must join every one of them.
		for i := range sel.NodeSelectorTerms {
			sel.NodeSelectorTerms[i].MatchFields = append(sel.NodeSelectorTerms[i].MatchFields, term.MatchFields...)
		}
	}
	return out
}

// brokerPod is the desired broker Pod of inst on node.
func brokerPod(inst *v1alpha1.Instance, cfg *v1alpha1.Configuration, node string) *corev1.Pod {
	device := withDevice(cfg.Spec.BrokerSpec.BrokerPodSpec, inst)
	hash := specHash(cfg.Spec.BrokerSpec.BrokerPodSpec)
	if usesClaims(cfg) {
		device = withClaim(cfg.Spec.BrokerSpec.BrokerPodSpec, ClaimTemplateName(inst.Name))
		hash += "-dra" // a change of allocation rolls the brokers
	}
	spec := pinned(device, node)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: v1alpha1.BrokerPodName(inst.Name, node), Namespace: inst.Namespace,
			Labels:          labels(inst, node),
			Annotations:     map[string]string{v1alpha1.AnnotationSpecHash: hash},
			OwnerReferences: owner(inst),
		},
		Spec: *spec,
	}
}
