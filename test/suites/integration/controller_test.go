package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/controller"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

type runningController struct {
	requests *requestCounter
	cancel   context.CancelFunc
	done     chan error
}

func startController(t *testing.T, grace time.Duration) *runningController {
	t.Helper()
	counter := &requestCounter{}
	restCfg := rest.CopyConfig(suite.Config)
	restCfg.WrapTransport = counter.wrap
	ctx, cancel := context.WithCancel(context.Background())
	c := &runningController{requests: counter, cancel: cancel, done: make(chan error, 1)}
	go func() {
		c.done <- controller.Run(ctx, controller.Config{RESTConfig: restCfg, SkipNameValidation: true, NodeGracePeriod: grace, Client: kubeflags.Client{QPS: 1000, Burst: 2000},
			Serving: kubeflags.Off(), Registerer: prometheus.NewRegistry(),
			AgentServiceAccounts: []string{kube.AgentNamespace + "/" + kube.AgentServiceAccount}}, testr.New(t).WithName("controller"))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-c.done:
			if err != nil {
				t.Errorf("controller: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("controller did not stop")
		}
	})
	return c
}

func createNode(t *testing.T, name string, ready bool, since time.Time) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := suite.Client.Create(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = suite.Client.Delete(context.Background(), n) })
	setReady(t, n, ready, since)
	return n
}

func setReady(t *testing.T, n *corev1.Node, ready bool, since time.Time) {
	t.Helper()
	st := corev1.ConditionTrue
	if !ready {
		st = corev1.ConditionFalse
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st, LastTransitionTime: metav1.NewTime(since), LastHeartbeatTime: metav1.NewTime(since)}}
	if err := suite.Client.Status().Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
}

// createInstance writes an Instance as the agents would, with the nodes
// that see it.
func createInstance(t *testing.T, ns, cfg, device string, nodes ...string) *v1alpha1.Instance {
	t.Helper()
	inst := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: cfg + "-" + device, Namespace: ns},
		Spec: v1alpha1.InstanceSpec{ConfigurationName: cfg, DeviceID: device,
			Shared: true, Capacity: 1, BrokerProperties: map[string]string{"ID": device}},
	}
	for _, n := range nodes {
		inst.Status.Nodes = append(inst.Status.Nodes, v1alpha1.InstanceNode{Name: n})
	}
	if err := suite.Client.Create(context.Background(), inst); err != nil {
		t.Fatal(err)
	}
	return inst
}

func brokerPodSpec(image string) *corev1.PodSpec {
	return &corev1.PodSpec{Containers: []corev1.Container{{
		Name: "broker", Image: image,
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.BrokerResourcePlaceholder: resource.MustParse("1")}},
	}}}
}

func brokerPods(t *testing.T, ns, inst string) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := suite.Client.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelInstance: inst}); err != nil {
		t.Fatal(err)
	}
	var live []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp.IsZero() {
			live = append(live, p)
		}
	}
	return live
}

// markRunning plays the kubelet's part: envtest has none.
func markRunning(t *testing.T, p *corev1.Pod, phase corev1.PodPhase) {
	t.Helper()
	p.Status.Phase = phase
	if err := suite.Client.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

// finishDeletion stands in for the kubelet, which would remove a deleted
// pod's object once its containers stopped.
func finishDeletion(t *testing.T, ns string) {
	var pods corev1.PodList
	if err := suite.Client.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if !p.DeletionTimestamp.IsZero() {
			_ = suite.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0))
		}
	}
}

func TestControllerBrokerPodsServicesAndStatus(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	createNode(t, "ctl-node-a", true, time.Now())
	createNode(t, "ctl-node-b", true, time.Now())
	ctl := startController(t, time.Minute)
	createConfiguration(t, ns, "cams", "debug-echo", `{}`, func(c *v1alpha1.Configuration) {
		c.Spec.BrokerSpec = &v1alpha1.BrokerSpec{BrokerPodSpec: brokerPodSpec("broker:v1")}
		c.Spec.InstanceServiceSpec = &corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}
		c.Spec.ConfigurationServiceSpec = &corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}
	})
	inst := createInstance(t, ns, "cams", "cam1", "ctl-node-a", "ctl-node-b")

	var pods []corev1.Pod
	testwait.For(t, 10*time.Second, func() error {
		pods = brokerPods(t, ns, inst.Name)
		if len(pods) != 2 {
			return fmt.Errorf("%d broker pods", len(pods))
		}
		return nil
	})
	for _, p := range pods {
		lim := p.Spec.Containers[0].Resources.Limits
		if q, ok := lim[corev1.ResourceName(inst.ResourceName())]; !ok || q.Value() != 1 {
			t.Fatalf("pod %s limits %v: want dowse.dev/%s: 1 in place of the placeholder", p.Name, lim, inst.Name)
		}
		if _, ok := lim[v1alpha1.BrokerResourcePlaceholder]; ok {
			t.Fatalf("placeholder left in %s", p.Name)
		}
		node := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields[0].Values[0]
		if p.Labels[v1alpha1.LabelNode] != node || len(p.OwnerReferences) != 1 || p.OwnerReferences[0].UID != inst.UID {
			t.Fatalf("pod %s: node %s labels %v owners %v", p.Name, node, p.Labels, p.OwnerReferences)
		}
	}
	// No Service until a broker runs.
	svc := &corev1.Service{}
	if err := suite.Client.Get(ctx, keyOf(ns, v1alpha1.InstanceServiceName(inst.Name)), svc); !apierrors.IsNotFound(err) {
		t.Fatalf("instance service before any broker runs: %v", err)
	}
	markRunning(t, &pods[0], corev1.PodRunning)
	testwait.For(t, 10*time.Second, func() error {
		if err := suite.Client.Get(ctx, keyOf(ns, v1alpha1.InstanceServiceName(inst.Name)), svc); err != nil {
			return err
		}
		if svc.Spec.Selector[v1alpha1.LabelInstance] != inst.Name {
			return fmt.Errorf("selector %v", svc.Spec.Selector)
		}
		cs := &corev1.Service{}
		if err := suite.Client.Get(ctx, keyOf(ns, v1alpha1.ConfigurationServiceName("cams")), cs); err != nil {
			return err
		}
		var cfg v1alpha1.Configuration
		if err := suite.Client.Get(ctx, keyOf(ns, "cams"), &cfg); err != nil {
			return err
		}
		if cfg.Status.Instances != 1 || cfg.Status.Brokers != 1 {
			return fmt.Errorf("status instances %d brokers %d", cfg.Status.Instances, cfg.Status.Brokers)
		}
		return nil
	})

	// Steady state: no writes. A status reconcile is debounced by a second
	// (broker.statusDelay) and may still be queued from the last change;
	// let it run first.
	time.Sleep(1500 * time.Millisecond)
	before := ctl.requests.writes.Load()
	consistently(t, 2*time.Second, func() error {
		if w := ctl.requests.writes.Load() - before; w != 0 {
			return fmt.Errorf("%d writes in a steady state", w)
		}
		return nil
	})

	// A deleted broker comes back.
	if err := suite.Client.Delete(ctx, &pods[1], client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		now := brokerPods(t, ns, inst.Name)
		if len(now) != 2 {
			return fmt.Errorf("%d pods", len(now))
		}
		return nil
	})

	// A node that stops seeing the device loses its broker.
	var cur v1alpha1.Instance
	if err := suite.Client.Get(ctx, keyOf(ns, inst.Name), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Status.Nodes = []v1alpha1.InstanceNode{{Name: "ctl-node-a"}}
	if err := suite.Client.Update(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		finishDeletion(t, ns)
		now := brokerPods(t, ns, inst.Name)
		if len(now) != 1 || now[0].Labels[v1alpha1.LabelNode] != "ctl-node-a" {
			return fmt.Errorf("pods %d", len(now))
		}
		return nil
	})

	// A new broker spec rolls the brokers.
	var cfg v1alpha1.Configuration
	if err := suite.Client.Get(ctx, keyOf(ns, "cams"), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Spec.BrokerSpec.BrokerPodSpec.Containers[0].Image = "broker:v2"
	if err := suite.Client.Update(ctx, &cfg); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		finishDeletion(t, ns)
		now := brokerPods(t, ns, inst.Name)
		if len(now) != 1 || now[0].Spec.Containers[0].Image != "broker:v2" {
			return fmt.Errorf("pods %v", len(now))
		}
		return nil
	})

	// The Instance going away takes its brokers and Service with it.
	if err := suite.Client.Delete(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		finishDeletion(t, ns)
		if n := len(brokerPods(t, ns, inst.Name)); n != 0 {
			return fmt.Errorf("%d pods left", n)
		}
		err := suite.Client.Get(ctx, keyOf(ns, v1alpha1.InstanceServiceName(inst.Name)), &corev1.Service{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("instance service: %w", err)
		}
		return nil
	})
}

func TestControllerFailedBrokerIsRecreatedWithBackoff(t *testing.T) {
	ns := suite.Namespace(t)
	createNode(t, "ctl-node-f", true, time.Now())
	startController(t, time.Minute)
	createConfiguration(t, ns, "flaky", "debug-echo", `{}`, func(c *v1alpha1.Configuration) {
		c.Spec.BrokerSpec = &v1alpha1.BrokerSpec{BrokerPodSpec: brokerPodSpec("broker:v1")}
	})
	inst := createInstance(t, ns, "flaky", "d1", "ctl-node-f")
	var first corev1.Pod
	testwait.For(t, 10*time.Second, func() error {
		pods := brokerPods(t, ns, inst.Name)
		if len(pods) != 1 {
			return fmt.Errorf("%d pods", len(pods))
		}
		first = pods[0]
		return nil
	})
	markRunning(t, &first, corev1.PodFailed)
	failed := time.Now()
	testwait.For(t, 10*time.Second, func() error {
		finishDeletion(t, ns)
		pods := brokerPods(t, ns, inst.Name)
		if len(pods) != 1 || pods[0].UID == first.UID {
			return fmt.Errorf("not recreated")
		}
		return nil
	})
	if waited := time.Since(failed); waited < 900*time.Millisecond {
		t.Fatalf("recreated after %s, before the 1 s backoff", waited)
	}
}

func TestControllerJobsAndRefusedSpecs(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	createNode(t, "ctl-node-j", true, time.Now())
	startController(t, time.Minute)
	createConfiguration(t, ns, "jobs", "debug-echo", `{}`, func(c *v1alpha1.Configuration) {
		c.Spec.BrokerSpec = &v1alpha1.BrokerSpec{BrokerJobSpec: &batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "once", Image: "job:v1"}}}}}}
	})
	createConfiguration(t, ns, "broken", "debug-echo", `{}`, func(c *v1alpha1.Configuration) {
		c.Spec.BrokerSpec = &v1alpha1.BrokerSpec{BrokerPodSpec: brokerPodSpec("broker:v1")}
		c.Spec.BrokerSpec.BrokerPodSpec.Containers[0].Name = "Not_A_Valid_Name"
	})
	ji := createInstance(t, ns, "jobs", "j1", "ctl-node-j")
	createInstance(t, ns, "broken", "b1", "ctl-node-j")
	jobsOf := func() []batchv1.Job {
		var jobs batchv1.JobList
		if err := suite.Client.List(ctx, &jobs, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelInstance: ji.Name}); err != nil {
			t.Fatal(err)
		}
		var live []batchv1.Job
		for _, j := range jobs.Items {
			if j.DeletionTimestamp.IsZero() {
				live = append(live, j)
			}
		}
		return live
	}
	testwait.For(t, 10*time.Second, func() error {
		jobs := jobsOf()
		if len(jobs) != 1 || jobs[0].Name != v1alpha1.BrokerJobName(ji.Name, 1) {
			return fmt.Errorf("jobs %d", len(jobs))
		}
		if _, ok := jobs[0].Spec.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceName(ji.ResourceName())]; !ok {
			return fmt.Errorf("job does not ask for the device")
		}
		return nil
	})
	testwait.For(t, 10*time.Second, func() error {
		var cfg v1alpha1.Configuration
		if err := suite.Client.Get(ctx, keyOf(ns, "broken"), &cfg); err != nil {
			return err
		}
		c := meta.FindStatusCondition(cfg.Status.Conditions, v1alpha1.ConditionBrokersDeployed)
		if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "Not_A_Valid_Name") {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	// A Job's pod carries the Instance's labels, but is the Job's: the
	// controller must leave it alone (it once deleted such pods as stray
	// brokers, failing every Job broker).
	job := jobsOf()[0]
	jobPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: job.Name + "-pod", Namespace: ns, Labels: job.Spec.Template.Labels,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(&job, batchv1.SchemeGroupVersion.WithKind("Job"))}},
		Spec: job.Spec.Template.Spec}
	if err := suite.Client.Create(ctx, jobPod); err != nil {
		t.Fatal(err)
	}
	// A new generation gets a new Job; the old one goes.
	var cfg v1alpha1.Configuration
	if err := suite.Client.Get(ctx, keyOf(ns, "jobs"), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Spec.BrokerSpec.BrokerJobSpec.Template.Spec.Containers[0].Image = "job:v2"
	if err := suite.Client.Update(ctx, &cfg); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		jobs := jobsOf()
		if len(jobs) != 1 || jobs[0].Name != v1alpha1.BrokerJobName(ji.Name, 2) {
			return fmt.Errorf("jobs %v", len(jobs))
		}
		return nil
	})
	if err := suite.Client.Get(ctx, client.ObjectKeyFromObject(jobPod), &corev1.Pod{}); err != nil {
		t.Fatalf("the Job's pod: %v", err)
	}
	// The broken Configuration did not disturb the good one.
	testwait.For(t, 10*time.Second, func() error {
		var good v1alpha1.Configuration
		if err := suite.Client.Get(ctx, keyOf(ns, "jobs"), &good); err != nil {
			return err
		}
		c := meta.FindStatusCondition(good.Status.Conditions, v1alpha1.ConditionBrokersDeployed)
		if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != good.Generation {
			return fmt.Errorf("good configuration condition %+v", c)
		}
		return nil
	})
}

func TestControllerRemovesDeadNodes(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	const grace = 2 * time.Second
	createNode(t, "ctl-node-ok", true, time.Now())
	sick := createNode(t, "ctl-node-sick", true, time.Now())
	doomed := createNode(t, "ctl-node-doomed", true, time.Now())
	startController(t, grace)
	cfg := createConfiguration(t, ns, "shared", "debug-echo", `{}`)
	// The doomed node's agent holds a finalizer on the Configuration.
	cfg.Finalizers = []string{v1alpha1.AgentFinalizer("ctl-node-doomed"), v1alpha1.AgentFinalizer("ctl-node-ok")}
	if err := suite.Client.Update(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	createInstance(t, ns, "shared", "s1", "ctl-node-ok", "ctl-node-sick")
	createInstance(t, ns, "shared", "s2", "ctl-node-doomed")
	createInstance(t, ns, "shared", "s3", "ctl-node-ok", "ctl-node-ghost")

	setReady(t, sick, false, time.Now())
	if err := suite.Client.Delete(ctx, doomed); err != nil {
		t.Fatal(err)
	}
	// Within the grace period the NotReady node stays.
	consistently(t, grace/2, func() error {
		for _, v := range listInstances(t, ns, "shared") {
			if v.DeviceID == "s1" && len(v.Nodes) != 2 {
				return fmt.Errorf("sick node removed before the grace period: %v", v.Nodes)
			}
		}
		return nil
	})
	testwait.For(t, 15*time.Second, func() error {
		got := map[string][]string{}
		for _, v := range listInstances(t, ns, "shared") {
			got[v.DeviceID] = v.Nodes
		}
		if len(got) != 2 || strings.Join(got["s1"], ",") != "ctl-node-ok" || strings.Join(got["s3"], ",") != "ctl-node-ok" {
			return fmt.Errorf("instances %v", got)
		}
		var c v1alpha1.Configuration
		if err := suite.Client.Get(ctx, client.ObjectKeyFromObject(cfg), &c); err != nil {
			return err
		}
		if strings.Join(c.Finalizers, ",") != v1alpha1.AgentFinalizer("ctl-node-ok") {
			return fmt.Errorf("finalizers %v", c.Finalizers)
		}
		return nil
	})
	// Clean up the finalizer so the namespace can go.
	var c v1alpha1.Configuration
	if err := suite.Client.Get(ctx, client.ObjectKeyFromObject(cfg), &c); err == nil {
		c.Finalizers = nil
		_ = suite.Client.Update(ctx, &c)
	}
}
