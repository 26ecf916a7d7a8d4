package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	debugbroker "github.com/dowse-dev/dowse/brokers/debug-echo"
	"github.com/dowse-dev/dowse/controller"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/handler"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

const brokerImage = "ghcr.io/dowse-dev/dowse-debug-echo-broker:latest"

// TestBrokersOnNode runs the samples' broker Configurations through the
// whole chain on a real node: discovery, Instance, device plugin, the
// controller's broker Pod, Job and Services, the broker receiving its device
// through CDI and answering behind the Services.
func TestBrokersOnNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, [2]string{"./brokers/debug-echo/cmd/dowse-debug-echo-broker", brokerImage})
	d := startDowse(t, ctx, c)
	d.startAgent(false)
	ctrlCtx, stopCtrl := context.WithCancel(ctx)
	ctrlDone := make(chan error, 1)
	go func() {
		ctrlDone <- controller.Run(ctrlCtx, controller.Config{RESTConfig: c.Config, SkipNameValidation: true, NodeGracePeriod: time.Minute,
			Serving: kubeflags.Off(), Registerer: prometheus.NewRegistry()}, testr.New(t).WithName("controller"))
	}()
	t.Cleanup(func() {
		stopCtrl()
		if err := <-ctrlDone; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	cl, cs := d.cl, c.Client

	// The sample as a user applies it, but on a free port: the broker uses
	// the node's network, and 8080 may be taken on this machine.
	port, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	podCfg := loadSample(t, "debug-echo-broker-pod.yaml")
	bc := &podCfg.Spec.BrokerSpec.BrokerPodSpec.Containers[0]
	bc.Args[0] = fmt.Sprintf("--listen=:%d", port)
	bc.Ports[0].ContainerPort = int32(port)
	if err := cl.Create(ctx, podCfg); err != nil {
		t.Fatal(err)
	}
	sel := client.MatchingLabels{v1alpha1.LabelConfiguration: v1alpha1.LabelValue(podCfg.Name)}
	inst := waitInstances(t, ctx, cl, podCfg.Name, 1)[0]
	instSvc, cfgSvc := v1alpha1.InstanceServiceName(inst.Name), v1alpha1.ConfigurationServiceName(podCfg.Name)

	// runningBroker waits for the one Running broker Pod of the Instance
	// and checks it got the device.
	runningBroker := func() *corev1.Pod {
		t.Helper()
		var pod corev1.Pod
		name := v1alpha1.BrokerPodName(inst.Name, c.NodeName)
		for {
			err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &pod)
			if err == nil && pod.Status.Phase == corev1.PodRunning && pod.DeletionTimestamp == nil {
				break
			}
			if err == nil && pod.Status.Phase == corev1.PodFailed {
				t.Fatalf("broker pod failed: %+v\n%s", pod.Status, podLogs(t, ctx, cs, name))
			}
			for _, st := range pod.Status.ContainerStatuses {
				if w := st.State.Waiting; err == nil && w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
					t.Fatalf("broker pod cannot get its image: %s", w.Message)
				}
			}
			if ctx.Err() != nil {
				t.Fatalf("no Running broker pod %s: %v %+v", name, err, pod.Status)
			}
			time.Sleep(100 * time.Millisecond)
		}
		res := corev1.ResourceName(inst.ResourceName())
		if q := pod.Spec.Containers[0].Resources.Limits[res]; q.Value() != 1 {
			t.Fatalf("broker pod does not ask for %s: %v", res, pod.Spec.Containers[0].Resources.Limits)
		}
		return &pod
	}
	// answers checks that a Service's EndpointSlices lead to a broker
	// answering with the device's environment. There is no kube-proxy on
	// the test node, so the test follows the Service to its endpoints as a
	// proxy would: the endpoint's address is the node's own (the broker
	// uses the node's network), reached on loopback.
	answers := func(svc string) {
		t.Helper()
		var addr string
		for {
			var slices discoveryv1.EndpointSliceList
			if err := cl.List(ctx, &slices, client.InNamespace("default"), client.MatchingLabels{discoveryv1.LabelServiceName: svc}); err != nil {
				t.Fatal(err)
			}
			for _, s := range slices.Items {
				for _, ep := range s.Endpoints {
					if ep.Conditions.Ready != nil && *ep.Conditions.Ready && len(s.Ports) == 1 && s.Ports[0].Port != nil {
						if int(*s.Ports[0].Port) != port {
							t.Fatalf("Service %s: endpoint port %d, want the broker's %d", svc, *s.Ports[0].Port, port)
						}
						addr = fmt.Sprintf("127.0.0.1:%d", *s.Ports[0].Port)
					}
				}
			}
			if addr != "" {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("Service %s has no ready endpoint: %+v", svc, slices.Items)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// An endpoint slice may still name a broker that was just replaced.
		var resp *http.Response
		var err error
		for range 50 {
			if resp, err = http.Get("http://" + addr + "/"); err == nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("Service %s endpoint %s: %v", svc, addr, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var reply debugbroker.Reply
		if err := json.Unmarshal(body, &reply); err != nil {
			t.Fatalf("Service %s: %v: %s", svc, err, body)
		}
		if reply.Device["DEBUG_ECHO_DESCRIPTION"] != "foo0" || reply.Device["GREETING"] != "hello" {
			t.Fatalf("Service %s: the broker did not get the device: %s", svc, body)
		}
	}
	// gone waits until nothing of the Configuration's kind exists.
	gone := func(what string, list client.ObjectList, opts ...client.ListOption) {
		t.Helper()
		for {
			if err := cl.List(ctx, list, append(opts, client.InNamespace("default"))...); err != nil {
				t.Fatal(err)
			}
			n := meta.LenList(list)
			if n == 0 {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%d %s left", n, what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	serviceExists := func(name string) {
		t.Helper()
		for {
			err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &corev1.Service{})
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("Service %s: %v", name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("BrokerGetsDevice", func(t *testing.T) {
		pod := runningBroker()
		// Running says the container started, not that it has printed yet.
		testwait.For(t, 30*time.Second, func() error {
			logs := podLogs(t, ctx, cs, pod.Name)
			for _, want := range []string{`"name":"DEBUG_ECHO_DESCRIPTION","value":"foo0"`, `"name":"GREETING","value":"hello"`} {
				if !strings.Contains(logs, want) {
					return fmt.Errorf("broker logs lack %s:\n%s", want, logs)
				}
			}
			return nil
		})
	})
	t.Run("ServicesAnswer", func(t *testing.T) {
		serviceExists(instSvc)
		serviceExists(cfgSvc)
		answers(instSvc)
		answers(cfgSvc)
		var cur v1alpha1.Configuration
		for {
			if err := cl.Get(ctx, client.ObjectKeyFromObject(podCfg), &cur); err != nil {
				t.Fatal(err)
			}
			if cur.Status.Instances == 1 && cur.Status.Brokers == 1 {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("Configuration status %+v", cur.Status)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	t.Run("DeletedBrokerComesBack", func(t *testing.T) {
		old := runningBroker()
		if err := cs.CoreV1().Pods("default").Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		for {
			p := runningBroker()
			if p.UID != old.UID {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("broker Running again %s after its deletion", time.Since(begin).Round(100*time.Millisecond))
		answers(instSvc)
	})
	t.Run("OfflineOnline", func(t *testing.T) {
		d.setAvailability(false)
		begin := time.Now()
		gone("broker pods", &corev1.PodList{}, sel)
		gone("services", &corev1.ServiceList{}, sel)
		t.Logf("OFFLINE: broker and Services gone after %s", time.Since(begin).Round(100*time.Millisecond))
		d.setAvailability(true)
		begin = time.Now()
		runningBroker()
		serviceExists(instSvc)
		serviceExists(cfgSvc)
		answers(cfgSvc)
		t.Logf("ONLINE: broker answering behind its Services after %s", time.Since(begin).Round(100*time.Millisecond))
	})

	jobCfg := loadSample(t, "debug-echo-broker-job.yaml")
	t.Run("JobPerInstance", func(t *testing.T) {
		if err := cl.Create(ctx, jobCfg); err != nil {
			t.Fatal(err)
		}
		insts := waitInstances(t, ctx, cl, jobCfg.Name, 2)
		jsel := client.MatchingLabels{v1alpha1.LabelConfiguration: v1alpha1.LabelValue(jobCfg.Name)}
		for _, in := range insts {
			name := v1alpha1.BrokerJobName(in.Name, jobCfg.Generation)
			var job batchv1.Job
			for {
				err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &job)
				if err == nil && job.Status.Succeeded == 1 {
					break
				}
				if err == nil && job.Status.Failed > 0 {
					var pods corev1.PodList
					_ = cl.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels{batchv1.JobNameLabel: name})
					for _, p := range pods.Items {
						t.Logf("pod %s: %s %s %s\n%s", p.Name, p.Status.Phase, p.Status.Reason, p.Status.Message, podLogs(t, ctx, cs, p.Name))
					}
					t.Fatalf("Job %s failed: %+v", name, job.Status)
				}
				if ctx.Err() != nil {
					t.Fatalf("Job %s never completed: %v %+v", name, err, job.Status)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		// Once per Instance: no second Job or Job pod appears afterwards.
		time.Sleep(3 * time.Second)
		var jobs batchv1.JobList
		var pods corev1.PodList
		if err := cl.List(ctx, &jobs, client.InNamespace("default"), jsel); err != nil {
			t.Fatal(err)
		}
		if err := cl.List(ctx, &pods, client.InNamespace("default"), client.HasLabels{batchv1.JobNameLabel}); err != nil {
			t.Fatal(err)
		}
		if len(jobs.Items) != 2 || len(pods.Items) != 2 {
			t.Fatalf("%d Jobs and %d Job pods for 2 Instances", len(jobs.Items), len(pods.Items))
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodSucceeded {
				t.Errorf("Job pod %s is %s", p.Name, p.Status.Phase)
			}
			if logs := podLogs(t, ctx, cs, p.Name); !strings.Contains(logs, `"name":"DEBUG_ECHO_DESCRIPTION","value":"bar`) {
				t.Errorf("Job pod %s did not get its device:\n%s", p.Name, logs)
			}
		}
	})
	t.Run("DeletingConfigurationsLeavesNothing", func(t *testing.T) {
		for _, cfg := range []*v1alpha1.Configuration{podCfg, jobCfg} {
			if err := cl.Delete(ctx, cfg); err != nil {
				t.Fatal(err)
			}
		}
		begin := time.Now()
		for _, cfg := range []*v1alpha1.Configuration{podCfg, jobCfg} {
			s := client.MatchingLabels{v1alpha1.LabelConfiguration: v1alpha1.LabelValue(cfg.Name)}
			gone("pods of "+cfg.Name, &corev1.PodList{}, s)
			gone("jobs of "+cfg.Name, &batchv1.JobList{}, s)
			gone("services of "+cfg.Name, &corev1.ServiceList{}, s)
			for {
				err := cl.Get(ctx, client.ObjectKeyFromObject(cfg), &v1alpha1.Configuration{})
				if apierrors.IsNotFound(err) {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("Configuration %s not deleted: %v", cfg.Name, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		gone("Instances", &v1alpha1.InstanceList{})
		// Job pods are the Jobs' (deleted in the background by the
		// garbage collector).
		gone("pods", &corev1.PodList{})
		t.Logf("everything of both Configurations gone %s after their deletion", time.Since(begin).Round(100*time.Millisecond))
	})
}

// loadSample reads samples/<file> into a Configuration in "default", its
// Pods on the node's network (cluster.OnHostNetwork): the tests' nodes have
// no pod network unless they ask for one.
func loadSample(t *testing.T, file string) *v1alpha1.Configuration {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(kube.RepoRoot(), "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &v1alpha1.Configuration{}
	if err := yaml.UnmarshalStrict(raw, cfg); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	cfg.Namespace = "default"
	cluster.OnHostNetwork(cfg)
	return cfg
}

// loadModel reads a DeviceModel from samples/, in namespace default.
func loadModel(t *testing.T, file string) *v1alpha1.DeviceModel {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(kube.RepoRoot(), "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	model := &v1alpha1.DeviceModel{}
	if err := yaml.UnmarshalStrict(raw, model); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	model.Namespace = "default"
	return model
}

// serveHandler runs a discovery handler in the test's process, registered
// with the agent of cfg.StateDir, until the test ends.
func serveHandler(t *testing.T, ctx context.Context, cfg handler.Config) {
	t.Helper()
	hctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- handler.Serve(hctx, cfg) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Logf("%s handler: %v", cfg.Name, err)
		}
	})
}

// deleteMapped deletes a Configuration of twins while the agent still runs,
// so that it lets go of the Instances, and waits for them and the mapper
// Pods to go.
func deleteMapped(t *testing.T, ctx context.Context, cl client.Client, cfg *v1alpha1.Configuration) {
	t.Helper()
	_ = cl.Delete(context.Background(), cfg)
	waitInstances(t, ctx, cl, cfg.Name, 0)
	eventuallyNode(t, ctx, time.Minute, func() error {
		var pods corev1.PodList
		if err := cl.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels{v1alpha1.LabelMapper: "true"}); err != nil || len(pods.Items) > 0 {
			return fmt.Errorf("%d mapper pods left (%w)", len(pods.Items), err)
		}
		return nil
	})
}

// waitInstances waits until configuration has n Instances and returns them.
func waitInstances(t *testing.T, ctx context.Context, cl client.Client, configuration string, n int) []v1alpha1.Instance {
	t.Helper()
	for {
		var l v1alpha1.InstanceList
		if err := cl.List(ctx, &l, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		var out []v1alpha1.Instance
		for _, in := range l.Items {
			if in.Spec.ConfigurationName == configuration {
				out = append(out, in)
			}
		}
		if len(out) == n {
			return out
		}
		if ctx.Err() != nil {
			t.Fatalf("Configuration %s: %d Instances, want %d", configuration, len(out), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
