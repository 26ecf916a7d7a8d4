// Package node holds the tests that need a real node: a kubelet, containerd
// and runc started by test/framework/cluster. They are their own tier (`make
// test-node`, also part of `make test`): they need root, runc (`make
// node-deps`) and the binaries of `make k8s`, and take about half a minute
// once those are built.
package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/test/framework/cluster"
)

const probeImage = "ghcr.io/dowse-dev/dowse-node-probe:test"

func TestMain(m *testing.M) {
	// Tests give what they run their own loggers; this only silences
	// controller-runtime's warning (with a stack) about an unset global one.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// startCluster starts the cluster or explains why it cannot. On a developer's
// machine without root or runc the tier skips; in CI (CI=true) the same
// condition is a failure, so the tier can never pass there by not running.
// Images are built from their packages (import path: image ref) beside the
// probe image and loaded into the node. The cluster stops when the test
// ends, and its state directory (logs) is kept only when the test failed.
func startCluster(t *testing.T, ctx context.Context, images ...[2]string) *cluster.Cluster {
	t.Helper()
	return startClusterWith(t, ctx, cluster.Options{}, images...)
}

// startClusterWith is startCluster with options (the images built here are
// loaded before o.Images).
func startClusterWith(t *testing.T, ctx context.Context, o cluster.Options, images ...[2]string) *cluster.Cluster {
	t.Helper()
	requireNode(t)
	var archives []string
	for _, im := range append([][2]string{{"./test/framework/cluster/cmd/dowse-node-probe", probeImage}}, images...) {
		name := filepath.Base(im[0])
		a, err := cluster.BuildImage(ctx, im[0], name, im[1])
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, a)
	}
	begin := time.Now()
	o.Images = append(archives, o.Images...)
	c, err := cluster.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Stop()
		if !t.Failed() {
			_ = os.RemoveAll(c.StateDir)
		}
	})
	t.Logf("cluster up in %s, state %s", time.Since(begin).Round(100*time.Millisecond), c.StateDir)
	return c
}

// newClient is a client of c's API server knowing Dowse's kinds.
func newClient(t *testing.T, c *cluster.Cluster) client.Client {
	t.Helper()
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.Config, client.Options{Scheme: sch})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// requireNode skips (or, in CI, fails) when this machine cannot run a node.
func requireNode(t *testing.T) {
	t.Helper()
	ci := os.Getenv("CI") == "true"
	unable := func(format string, args ...any) {
		t.Helper()
		if ci {
			t.Fatalf(format, args...)
		}
		t.Skipf(format, args...)
	}
	if os.Geteuid() != 0 {
		unable("node tests need root (kubelet, runc); skipped")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		unable("node tests need runc: run hack/install-node-deps.sh (apt-get install runc)")
	}
}

// TestNode brings one cluster up and runs each check against it, then tears it
// down and checks that nothing is left: one start-up pays for every check.
func TestNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startCluster(t, ctx)

	t.Run("PodLogs", func(t *testing.T) { testPodLogs(t, ctx, c) })
	t.Run("Job", func(t *testing.T) { testJob(t, ctx, c) })
	t.Run("GarbageCollection", func(t *testing.T) { testGC(t, ctx, c) })
	t.Run("DevicePlugin", func(t *testing.T) { testDevicePlugin(t, ctx, c) })

	t.Run("Teardown", func(t *testing.T) {
		pids := c.Pids()
		begin := time.Now()
		err := c.Stop()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("stopped in %s", time.Since(begin).Round(100*time.Millisecond))
		if left := c.Leftovers(); len(left) > 0 {
			t.Fatalf("left behind: %v", left)
		}
		for name, pid := range pids {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); !strings.Contains(string(b), ") Z") {
					t.Errorf("%s (pid %d) still runs", name, pid)
				}
			}
		}
	})
}

// probePod is a hostNetwork pod of the probe image, with no toleration and no
// nodeName: the scheduler must place it on the node.
func probePod(name string, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			HostNetwork:   true,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "probe", Image: probeImage, Args: args,
				ImagePullPolicy: corev1.PullNever, // loaded locally; nothing can be pulled
			}},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
}

func waitPodPhase(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string, phases ...corev1.PodPhase) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	for ctx.Err() == nil {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p
			for _, ph := range phases {
				if p.Status.Phase == ph {
					return p
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("pod %s never reached %v; last status: %+v", name, phases, last.Status)
	return nil
}

func podLogs(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string) string {
	t.Helper()
	b, err := cs.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of %s: %v", name, err)
	}
	return string(b)
}

func waitGone(t *testing.T, ctx context.Context, what string, get func() error) {
	t.Helper()
	for ctx.Err() == nil {
		if err := get(); apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s never went away", what)
}

func testPodLogs(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	pods := c.Client.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, probePod("hello", "echo:hello from a dowse node"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPodPhase(t, ctx, c.Client, "hello", corev1.PodSucceeded, corev1.PodFailed)
	if p.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod failed: %+v", p.Status)
	}
	if p.Spec.NodeName != c.NodeName {
		t.Fatalf("scheduled on %q, want %q", p.Spec.NodeName, c.NodeName)
	}
	if logs := podLogs(t, ctx, c.Client, "hello"); !strings.Contains(logs, "hello from a dowse node") {
		t.Fatalf("logs = %q", logs)
	}
	if err := pods.Delete(ctx, "hello", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ctx, "pod hello", func() error { _, err := pods.Get(ctx, "hello", metav1.GetOptions{}); return err })
}

func testJob(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	pod := probePod("", "echo:job done")
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "probe-job", Namespace: "default"},
		Spec: batchv1.JobSpec{
			BackoffLimit: new(int32),
			Template:     corev1.PodTemplateSpec{Spec: pod.Spec},
		},
	}
	jobs := c.Client.BatchV1().Jobs("default")
	if _, err := jobs.Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		j, err := jobs.Get(ctx, "probe-job", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if j.Status.Succeeded == 1 {
			break
		}
		if j.Status.Failed > 0 {
			t.Fatalf("job failed: %+v", j.Status)
		}
		if ctx.Err() != nil {
			t.Fatalf("job never completed: %+v", j.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Deleting the Job in the background leaves its pods to the garbage
	// collector: they must go too.
	bg := metav1.DeletePropagationBackground
	if err := jobs.Delete(ctx, "probe-job", metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ctx, "the job's pods", func() error {
		l, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "job-name=probe-job"})
		if err != nil {
			return err
		}
		if len(l.Items) == 0 {
			return apierrors.NewNotFound(corev1.Resource("pods"), "job-name=probe-job")
		}
		return nil
	})
}

func testGC(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	cms := c.Client.CoreV1().ConfigMaps("default")
	owner, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dependent", OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID,
	}}}}
	if _, err := cms.Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, "owner", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ctx, "the dependent ConfigMap", func() error { _, err := cms.Get(ctx, "dependent", metav1.GetOptions{}); return err })
}
