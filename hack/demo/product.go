package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	debugecho "github.com/dowse-dev/dowse/brokers/debug-echo"
	"github.com/dowse-dev/dowse/dowsectl"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/modbusplc"
)

// readSample reads samples/<file> strictly into obj, in "default".
func readSample(file string, obj client.Object) error {
	raw, err := os.ReadFile(filepath.Join(kube.RepoRoot(), "samples", file))
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(raw, obj); err != nil {
		return fmt.Errorf("samples/%s: %w", file, err)
	}
	obj.SetNamespace("default")
	return nil
}

// poll calls check every interval until it returns true or an error, or
// the timeout passes (then the last error says why).
func poll(ctx context.Context, timeout, interval time.Duration, what string, check func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := check()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s (%w)", what, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// showBroker applies samples/debug-echo-broker-pod.yaml (its broker on a
// free port of the node's network instead of 8080) and shows the broker
// Pod the controller runs for the device: the kubelet allocated it the
// Instance's device-plugin slot, the container runtime applied the CDI
// spec the agent wrote, and the broker serves the environment it got. The
// Configuration is deleted at the end, and its broker with it.
func showBroker(ctx context.Context, c *cluster.Cluster, cl client.Client) error {
	var cfg v1alpha1.Configuration
	if err := readSample("debug-echo-broker-pod.yaml", &cfg); err != nil {
		return err
	}
	cluster.OnHostNetwork(&cfg) // the demo's node has no pod network
	port, err := procs.FreePort()
	if err != nil {
		return err
	}
	bc := &cfg.Spec.BrokerSpec.BrokerPodSpec.Containers[0]
	bc.Args[0] = fmt.Sprintf("--listen=:%d", port)
	bc.Ports[0].ContainerPort = int32(port)
	if err := cl.Create(ctx, &cfg); err != nil {
		return err
	}
	say("applied samples/debug-echo-broker-pod.yaml (the broker on port %d): a broker Pod for each device of Configuration %q", port, cfg.Name)
	var inst v1alpha1.Instance
	if err := poll(ctx, time.Minute, 200*time.Millisecond, "the broker Configuration's Instance", func() (bool, error) {
		var l v1alpha1.InstanceList
		if err := cl.List(ctx, &l, client.InNamespace("default")); err != nil {
			return false, err
		}
		n := 0
		for _, in := range l.Items {
			if in.Spec.ConfigurationName == cfg.Name {
				inst, n = in, n+1
			}
		}
		return n == 1, fmt.Errorf("%d Instances", n)
	}); err != nil {
		return err
	}
	name := v1alpha1.BrokerPodName(inst.Name, c.NodeName)
	var pod corev1.Pod
	if err := poll(ctx, 2*time.Minute, 300*time.Millisecond, "broker pod "+name+" ready", func() (bool, error) {
		if err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &pod); err != nil {
			return false, err
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Ready {
				return true, nil
			}
			if w := cs.State.Waiting; w != nil {
				return false, fmt.Errorf("%s: %s", w.Reason, w.Message)
			}
		}
		return false, fmt.Errorf("pod %s", pod.Status.Phase)
	}); err != nil {
		return err
	}
	res := corev1.ResourceName(inst.ResourceName())
	q := pod.Spec.Containers[0].Resources.Limits[res]
	say("broker pod %s is Running on %s and holds %s: %s (the agent's device plugin allocated it the Instance's slot)", name, pod.Spec.NodeName, res, q.String())

	// What the agent wrote for the container runtime.
	specFile := filepath.Join(c.CDIDir, inst.CDISpecFileName()+".json")
	raw, err := os.ReadFile(specFile)
	if err != nil {
		return fmt.Errorf("the Instance's CDI spec: %w", err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return fmt.Errorf("%s: %w", specFile, err)
	}
	var env []string
	for _, d := range spec.Devices {
		env = append(env, d.ContainerEdits.Env...)
	}
	say("CDI spec %s (kind %s) gives the container: %s", specFile, spec.Kind, strings.Join(env, " "))

	// What the broker got, as it serves it.
	var reply debugecho.Reply
	if err := poll(ctx, 30*time.Second, 300*time.Millisecond, "the broker's answer", func() (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK, json.NewDecoder(resp.Body).Decode(&reply)
	}); err != nil {
		return err
	}
	var got []string
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if reply.Device[k] != v {
			return fmt.Errorf("the broker's environment %v lacks %s from the CDI spec", reply.Device, kv)
		}
		got = append(got, kv)
	}
	say("the broker pod's environment has the device from the CDI spec: %s", strings.Join(got, " "))
	logs, err := c.Client.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err == nil {
		for _, l := range strings.Split(string(logs), "\n") {
			if strings.Contains(l, "DEBUG_ECHO_DESCRIPTION") {
				say("broker log: %s", strings.TrimSpace(l))
				break
			}
		}
	}
	if err := cl.Delete(ctx, &cfg); err != nil {
		return err
	}
	say("deleted Configuration %q: its Instance and broker pod go", cfg.Name)
	return nil
}

// showTwin shows a twin end to end: the demo's Modbus controller (plc) is
// found by the chart's dowse-modbus-discovery through
// samples/modbus-plc.yaml (scanning the controller's loopback address
// instead of the sample's /24, its mapper's metrics on a free port) and
// becomes a Device of samples/modbus-plc-model.yaml; the controller runs
// dowse-modbus-mapper for it, which gets the Device from the agent over
// DMI. A desired setpoint set with dowsectl travels the cloud/edge link to
// the mapper, which writes the controller's register; the setpoint and the
// temperature that follows it come back as reported values in
// Device.status.
func showTwin(ctx context.Context, cl client.Client, kubeconfig string, p *modbusplc.PLC) error {
	var model v1alpha1.DeviceModel
	if err := readSample("modbus-plc-model.yaml", &model); err != nil {
		return err
	}
	var cfg v1alpha1.Configuration
	if err := readSample("modbus-plc.yaml", &cfg); err != nil {
		return err
	}
	cluster.OnHostNetwork(&cfg) // the demo's node has no pod network
	var details map[string]any
	if err := yaml.Unmarshal(cfg.Spec.DiscoveryHandler.DiscoveryDetails.Raw, &details); err != nil {
		return err
	}
	details["targets"] = []string{p.Addr}
	raw, err := json.Marshal(details)
	if err != nil {
		return err
	}
	cfg.Spec.DiscoveryHandler.DiscoveryDetails = &apiextensionsv1.JSON{Raw: raw}
	mport, err := procs.FreePort()
	if err != nil {
		return err
	}
	mc := &cfg.Spec.DeviceTemplate.MapperPodSpec.Containers[0]
	mc.Args = []string{fmt.Sprintf("--metrics-address=127.0.0.1:%d", mport)}
	if err := cl.Create(ctx, &model); err != nil {
		return err
	}
	if err := cl.Create(ctx, &cfg); err != nil {
		return err
	}
	say("applied samples/modbus-plc-model.yaml and samples/modbus-plc.yaml (scanning the demo's Modbus controller at %s instead of 192.168.10.0/24)", p.Addr)

	var dev v1alpha1.Device
	key := func() client.ObjectKey { return client.ObjectKeyFromObject(&dev) }
	if err := poll(ctx, 2*time.Minute, 300*time.Millisecond, "the controller's Device with reported values", func() (bool, error) {
		var l v1alpha1.DeviceList
		if err := cl.List(ctx, &l, client.InNamespace("default")); err != nil {
			return false, err
		}
		if len(l.Items) != 1 {
			return false, fmt.Errorf("%d Devices", len(l.Items))
		}
		dev = l.Items[0]
		rep, obs := twinValues(&dev, "setpoint")
		// The sample's desired setpoint (21) applied, and the
		// temperature read.
		t, _ := twinValues(&dev, "temperature")
		return rep == "21" && obs == "21" && t != "", fmt.Errorf("setpoint reported %q observedDesired %q, temperature %q", rep, obs, t)
	}); err != nil {
		return err
	}
	say("Device %s (node %s) made from the Instance; the mapper applied the sample's desired setpoint 21 and reports:", dev.Name, dev.Spec.NodeName)
	printTwin(&dev)

	say("$ dowsectl twin set %s setpoint 30   (a desired value: the link carries it to the node's mapper)", dev.Name)
	args := []string{"twin", "set", dev.Name, "setpoint", "30", "--kubeconfig", kubeconfig, "-n", "default"}
	if err := dowsectl.Run(ctx, args, os.Stdout, os.Stderr); err != nil {
		return fmt.Errorf("dowsectl %s: %w", strings.Join(args, " "), err)
	}
	last := ""
	if err := poll(ctx, time.Minute, 200*time.Millisecond, "reported setpoint and temperature at 30", func() (bool, error) {
		if err := cl.Get(ctx, key(), &dev); err != nil {
			return false, err
		}
		rep, obs := twinValues(&dev, "setpoint")
		t, _ := twinValues(&dev, "temperature")
		if now := rep + "/" + t; now != last {
			last = now
			say("reported: setpoint %s (observed desired %s), temperature %s", rep, obs, t)
		}
		return rep == "30" && obs == "30" && near(t, 30), fmt.Errorf("setpoint reported %q observedDesired %q, temperature %q", rep, obs, t)
	}); err != nil {
		return err
	}
	say("the reported value followed the desired one: setpoint 30 reported, temperature 30 reported")
	printTwin(&dev)
	return nil
}

// near says whether the reported value v is x (a reading through scale
// and offset may carry float noise).
func near(v string, x float64) bool {
	f, err := strconv.ParseFloat(v, 64)
	return err == nil && math.Abs(f-x) < 0.05
}

func twinValues(d *v1alpha1.Device, prop string) (reported, observed string) {
	for _, tw := range d.Status.Twins {
		if tw.PropertyName == prop {
			if tw.Reported != nil {
				reported = tw.Reported.Value
			}
			if tw.ObservedDesired != nil {
				observed = tw.ObservedDesired.Value
			}
		}
	}
	return reported, observed
}

// printTwin prints the Device's twin as `dowsectl twin get` does.
func printTwin(d *v1alpha1.Device) {
	var b bytes.Buffer
	_ = dowsectl.PrintTwin(&b, d, metav1.Now().Time)
	for _, l := range strings.Split(strings.TrimRight(b.String(), "\n"), "\n") {
		say("  %s", l)
	}
}
