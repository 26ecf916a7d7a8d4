package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/scheme"
	"github.com/dowse-dev/dowse/test/cluster"
	"github.com/dowse-dev/dowse/test/kube"
)

// canUseNode says whether this machine can run the real one-node cluster.
func canUseNode() (bool, string) {
	if os.Geteuid() != 0 {
		return false, "the kubelet needs root"
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return false, "runc is missing (hack/install-node-deps.sh installs it)"
	}
	for _, b := range []string{"kubelet", "containerd", "kube-scheduler", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(kube.RepoRoot(), "bin", "k8s", b)); err != nil {
			return false, b + " is not built (make k8s)"
		}
	}
	return true, ""
}

// images are the Dowse pods of the demo, built as OCI archives from the
// binaries and named as deploy/ names them.
var images = []struct{ pkg, name string }{
	{"./agent/cmd/dowse-agent", "dowse-agent"},
	{"./controller/cmd/dowse-controller", "dowse-controller"},
	{"./discovery-handlers/debug-echo/cmd/dowse-debug-echo-discovery", "dowse-debug-echo-discovery"},
}

// runOnNode runs the demo on a real kubelet: the agent (with the debug-echo
// handler beside it) and the controller run as pods from locally built
// images, deployed from deploy/, and the agent joins the controller's
// cloud/edge link.
func runOnNode(ctx context.Context, every time.Duration, flips int) error {
	var archives []string
	for _, im := range images {
		say("building image ghcr.io/dowse-dev/%s:latest", im.name)
		a, err := cluster.BuildImage(ctx, im.pkg, im.name, "ghcr.io/dowse-dev/"+im.name+":latest")
		if err != nil {
			return err
		}
		archives = append(archives, a)
	}
	say("starting a one-node cluster: etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet")
	c, err := cluster.Start(ctx, cluster.Options{Images: archives})
	if err != nil {
		return err
	}
	defer func() {
		say("stopping the cluster")
		if err := c.Stop(); err != nil {
			say("stopping the cluster: %v", err)
			return
		}
		_ = os.RemoveAll(c.StateDir)
	}()
	say("cluster up; try: kubectl --kubeconfig %s get pods -A -o wide", c.Kubeconfig)

	sch, err := scheme.New()
	if err != nil {
		return err
	}
	if err := apiextensionsv1.AddToScheme(sch); err != nil {
		return err
	}
	cl, err := client.NewWithWatch(c.Config, client.Options{Scheme: sch})
	if err != nil {
		return err
	}
	state := filepath.Join(c.StateDir, "dowse")
	if err := os.MkdirAll(state, 0o755); err != nil {
		return err
	}
	api, err := url.Parse(c.Config.Host)
	if err != nil {
		return err
	}
	link, err := prepareLink(ctx, c, cl)
	if err != nil {
		return err
	}
	root := kube.RepoRoot()
	crds, err := filepath.Glob(filepath.Join(root, "deploy", "crds", "*.yaml"))
	if err != nil || len(crds) == 0 {
		return fmt.Errorf("no CRDs in deploy/crds (%v)", err)
	}
	for i := range crds {
		crds[i], _ = filepath.Rel(root, crds[i])
	}
	for _, f := range append(crds, "deploy/agent/agent.yaml", "deploy/handlers/debug-echo.yaml", "deploy/controller/controller.yaml") {
		objs, err := decodeFile(sch, filepath.Join(root, f))
		if err != nil {
			return err
		}
		for _, o := range objs {
			adapt(o, state, c.CDIDir, api)
			if err := link.adapt(o); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("%s: creating %T %s: %w", f, o, o.GetName(), err)
			}
		}
		say("applied %s", f)
	}
	if err := waitCRDs(ctx, cl); err != nil {
		return err
	}
	if err := waitRunning(ctx, cl, "dowse-system", 3); err != nil {
		return err
	}
	say("agent, debug-echo handler and controller pods are Running")
	if err := link.waitJoined(ctx); err != nil {
		return err
	}
	return watchAndFlip(ctx, cl, filepath.Join(state, "debug-echo-availability"), every, flips)
}

// adapt fits deploy/'s manifests to the demo node: images are local only
// (never pulled), pods use the host network (the node has no CNI) and reach
// the API server on loopback (there is no kube-proxy for the kubernetes
// Service), and the agent's state and CDI specs live under the cluster's
// state folder.
func adapt(o client.Object, state, cdiDir string, api *url.URL) {
	var spec *corev1.PodSpec
	switch w := o.(type) {
	case *appsv1.DaemonSet:
		spec = &w.Spec.Template.Spec
	case *appsv1.Deployment:
		spec = &w.Spec.Template.Spec
		// One node, one host network: a second controller replica would
		// contend for the first one's ports.
		one := int32(1)
		w.Spec.Replicas = &one
	default:
		return
	}
	spec.HostNetwork = true
	for i := range spec.Containers {
		ctr := &spec.Containers[i]
		ctr.ImagePullPolicy = corev1.PullNever
		// With the host network a probe would go to the node's own
		// interface address; keep it on loopback.
		for _, p := range []*corev1.Probe{ctr.LivenessProbe, ctr.ReadinessProbe} {
			if p != nil && p.HTTPGet != nil {
				p.HTTPGet.Host = "127.0.0.1"
			}
		}
		ctr.Env = append(ctr.Env,
			corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: api.Hostname()},
			corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: api.Port()})
	}
	for i := range spec.Volumes {
		if hp := spec.Volumes[i].HostPath; hp != nil && hp.Path == "/var/lib/dowse" {
			hp.Path = state
		}
		// The cluster's containerd reads CDI specs from its own folder.
		if hp := spec.Volumes[i].HostPath; hp != nil && hp.Path == "/var/run/cdi" {
			hp.Path = cdiDir
		}
	}
}

func decodeFile(sch *runtime.Scheme, path string) ([]client.Object, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := serializer.NewCodecFactory(sch).UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufioReader(raw))
	var out []client.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		co, ok := obj.(client.Object)
		if !ok {
			return nil, fmt.Errorf("%s: %T is not an object", path, obj)
		}
		out = append(out, co)
	}
}

func waitCRDs(ctx context.Context, cl client.Client) error {
	deadline := time.Now().Add(time.Minute)
	for _, name := range []string{"configurations.dowse.dev", "instances.dowse.dev", "devicemodels.dowse.dev", "devices.dowse.dev"} {
		for {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := cl.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
				return err
			}
			established := false
			for _, c := range crd.Status.Conditions {
				established = established || (c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue)
			}
			if established {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s not established within a minute", name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// waitRunning waits for n Running pods with all containers ready in ns.
func waitRunning(ctx context.Context, cl client.Client, ns string, n int) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var pods corev1.PodList
		if err := cl.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return err
		}
		ready := 0
		var states []string
		for _, p := range pods.Items {
			ok := p.Status.Phase == corev1.PodRunning
			state := string(p.Status.Phase)
			for _, cs := range p.Status.ContainerStatuses {
				ok = ok && cs.Ready
				if !cs.Ready {
					state += fmt.Sprintf(" (%s not ready, %d restarts)", cs.Name, cs.RestartCount)
				}
			}
			if ok {
				ready++
			}
			states = append(states, fmt.Sprintf("%s=%s", p.Name, state))
		}
		if ready >= n {
			return nil
		}
		if time.Now().After(deadline) {
			// The kubelet's events say why a probe failed.
			var events corev1.EventList
			_ = cl.List(ctx, &events, client.InNamespace(ns))
			for _, e := range events.Items {
				if e.Type == corev1.EventTypeWarning {
					states = append(states, fmt.Sprintf("%s: %s %s", e.InvolvedObject.Name, e.Reason, e.Message))
				}
			}
			return fmt.Errorf("%d of %d Dowse pods running after 3 minutes: %v", ready, n, states)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
