package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/peers/modbusplc"
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
	if _, err := os.Stat(helmPath()); err != nil {
		return false, "bin/helm is not built (make helm)"
	}
	return true, ""
}

// images are the Dowse pods of the demo, built as OCI archives from the
// binaries and named as the chart and the samples name them (tag latest).
var images = []struct{ pkg, name string }{
	{"./agent/cmd/dowse-agent", "dowse-agent"},
	{"./controller/cmd/dowse-controller", "dowse-controller"},
	{"./discovery-handlers/debug-echo/cmd/dowse-debug-echo-discovery", "dowse-debug-echo-discovery"},
	{"./brokers/debug-echo/cmd/dowse-debug-echo-broker", "dowse-debug-echo-broker"},
	{"./discovery-handlers/modbus/cmd/dowse-modbus-discovery", "dowse-modbus-discovery"},
	{"./mappers/modbus/cmd/dowse-modbus-mapper", "dowse-modbus-mapper"},
}

// runOnNode runs the demo on a real kubelet: Dowse is installed with its
// Helm chart (installChart), so the agent, the debug-echo and Modbus
// handlers and the controller run as the chart's pods from locally built
// images, and the agent joins the controller's cloud/edge link. Then a
// broker pod gets a device (showBroker), a desired value moves a Modbus
// controller and its readings come back (showTwin), and the Instances
// flip.
func runOnNode(ctx context.Context, every time.Duration, flips int) error {
	var archives []string
	for i, im := range images {
		// The first static build compiles the module's dependencies.
		how := "about a second when cached"
		if i == 0 {
			how = "a static Go build: 1 to 3 minutes the first time, seconds after"
		}
		begin := time.Now()
		say("building image ghcr.io/dowse-dev/%s:latest with go-containerregistry (%s)", im.name, how)
		a, err := cluster.BuildImage(ctx, im.pkg, im.name, "ghcr.io/dowse-dev/"+im.name+":latest")
		if err != nil {
			return err
		}
		say("  built %s in %s", a, time.Since(begin).Round(100*time.Millisecond))
		archives = append(archives, a)
	}
	say("starting a one-node cluster: etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet (about 10 s)")
	begin := time.Now()
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
	say("cluster up in %s; try: kubectl --kubeconfig %s get pods -A -o wide", time.Since(begin).Round(100*time.Millisecond), c.Kubeconfig)

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
	link, err := installChart(ctx, c, state)
	if err != nil {
		return err
	}
	if err := waitCRDs(ctx, cl); err != nil {
		return err
	}
	if err := waitRunning(ctx, cl, "dowse-system", 4); err != nil {
		return err
	}
	say("agent, debug-echo and Modbus handlers and controller pods are Running")
	if err := link.waitJoined(ctx); err != nil {
		return err
	}
	if err := showBroker(ctx, c, cl); err != nil {
		return fmt.Errorf("the broker pod: %w", err)
	}
	p, err := modbusplc.Start(func(v int16) { say("Modbus controller: holding register 0 (setpoint) written: %d", v) })
	if err != nil {
		return err
	}
	defer p.Stop()
	say("a Modbus TCP controller (github.com/simonvetter/modbus) serves the modbus-plc model's registers on %s; its temperature follows its setpoint", p.Addr)
	if err := showTwin(ctx, cl, c.Kubeconfig, p); err != nil {
		return fmt.Errorf("the twin: %w", err)
	}
	return watchAndFlip(ctx, cl, c.Kubeconfig, filepath.Join(state, "discovery", "debug-echo-availability"), every, flips)
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
