package brokers

import (
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// A broker asks for its Instance's resource, the one the agent's Instance
// device plugin serves, wherever the spec put the placeholder.
func TestWithDeviceAsksForTheInstanceResource(t *testing.T) {
	inst := &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Namespace: "plant", Name: "cam-0123456789abcdef"}}
	res := corev1.ResourceName("dowse.dev/cam-0123456789abcdef.plant")
	spec := &corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceName(v1alpha1.LegacyResourceName(Placeholder)): resource.MustParse("1")}}}},
		Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{Placeholder: resource.MustParse("1")}}}},
	}
	out := withDevice(spec, inst)
	if _, ok := out.Containers[0].Resources.Limits[res]; !ok || len(out.Containers[0].Resources.Limits) != 1 {
		t.Errorf("limits %v, want only %s", out.Containers[0].Resources.Limits, res)
	}
	if _, ok := out.InitContainers[0].Resources.Requests[res]; !ok {
		t.Errorf("init requests %v, want %s", out.InitContainers[0].Resources.Requests, res)
	}
	if _, ok := spec.Containers[0].Resources.Limits[Placeholder]; !ok {
		t.Error("withDevice changed the Configuration's spec")
	}
	plain := withDevice(&corev1.PodSpec{Containers: []corev1.Container{{Name: "a"}, {Name: "b"}}}, inst)
	if q := plain.Containers[0].Resources.Limits[res]; q.Value() != 1 || plain.Containers[1].Resources.Limits != nil {
		t.Errorf("without a placeholder: limits %v and %v, want one slot on the first container", plain.Containers[0].Resources.Limits, plain.Containers[1].Resources.Limits)
	}
}

func TestPinnedJoinsEveryTerm(t *testing.T) {
	spec := &corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}},
		}}}}}
	out := pinned(spec, "node-1")
	for i, term := range out.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		if len(term.MatchFields) != 1 || term.MatchFields[0].Values[0] != "node-1" {
			t.Errorf("term %d: %+v lacks the node", i, term)
		}
	}
	if p := pinned(&corev1.PodSpec{}, "node-2"); p.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields[0].Values[0] != "node-2" {
		t.Errorf("no affinity: %+v", p.Affinity)
	}
}

func TestNamesFitTheirLimits(t *testing.T) {
	inst := v1alpha1.InstanceName(strings.Repeat("c", 80), v1alpha1.DeviceHash("d", true, ""))
	node := strings.Repeat("n", 253)
	if errs := validation.IsDNS1123Subdomain(v1alpha1.BrokerPodName(inst, node)); len(errs) > 0 {
		t.Errorf("pod name %q: %v", v1alpha1.BrokerPodName(inst, node), errs)
	}
	if v1alpha1.BrokerPodName(inst, "a") == v1alpha1.BrokerPodName(inst, "b") {
		t.Error("two nodes' brokers share a name")
	}
	for _, n := range []string{v1alpha1.BrokerJobName(inst, 1<<40), v1alpha1.InstanceServiceName(inst), v1alpha1.ConfigurationServiceName(strings.Repeat("c", 253))} {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			t.Errorf("%q: %v", n, errs)
		}
	}
}

// A broker's restart backoff doubles from 1 s up to 5 minutes, and is
// forgotten with its Instance.
func TestRestartBackoffIsForgottenWithItsInstance(t *testing.T) {
	r := NewInstanceReconciler(nil, nil, nil, NewRefusals(), logr.Discard())
	inst := types.NamespacedName{Namespace: "ns", Name: "cam"}
	pod := types.NamespacedName{Namespace: "ns", Name: "cam-broker"}
	other := types.NamespacedName{Namespace: "ns", Name: "other-broker"}
	var waits []time.Duration
	for range 11 {
		r.noteFailure(inst, pod)
		waits = append(waits, r.waitBeforeRestart(pod))
	}
	r.noteFailure(types.NamespacedName{Namespace: "ns", Name: "other"}, other)
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		if waits[i] > want || waits[i] < want-100*time.Millisecond {
			t.Errorf("failure %d: wait %v, want %v", i+1, waits[i], want)
		}
	}
	if last := waits[len(waits)-1]; last > 5*time.Minute || last < 5*time.Minute-time.Second {
		t.Errorf("wait after many failures: %v, want the 5 minute cap", last)
	}
	r.forgetFailures(inst)
	if w := r.waitBeforeRestart(pod); w != 0 {
		t.Errorf("a gone Instance's broker still waits %v", w)
	}
	if w := r.waitBeforeRestart(other); w <= 0 {
		t.Error("another Instance's backoff was forgotten too")
	}
}

func TestPinnedPodsStayThroughCuts(t *testing.T) {
	own := corev1.Toleration{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](60)}
	out := pinned(&corev1.PodSpec{Tolerations: []corev1.Toleration{own}}, "edge-1")
	var unreachable, notReady int
	for _, tol := range out.Tolerations {
		switch tol.Key {
		case corev1.TaintNodeUnreachable:
			unreachable++
			if tol.TolerationSeconds != nil || tol.Effect != corev1.TaintEffectNoExecute || tol.Operator != corev1.TolerationOpExists {
				t.Errorf("unreachable toleration %+v, want NoExecute for ever", tol)
			}
		case corev1.TaintNodeNotReady:
			notReady++
			if tol.TolerationSeconds == nil || *tol.TolerationSeconds != 60 {
				t.Errorf("the template's own not-ready toleration became %+v", tol)
			}
		}
	}
	if unreachable != 1 || notReady != 1 {
		t.Errorf("tolerations %+v: want one each for unreachable and not-ready", out.Tolerations)
	}
}
