package dowsectl

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

func newPortForwardCommand(c *cli) *cobra.Command {
	var addresses []string
	cmd := &cobra.Command{
		Use:   "port-forward device/NAME|instance/NAME|pod/NAME [LOCAL_PORT:]REMOTE_PORT...",
		Short: "Forward local ports to a device's broker or mapper",
		Long: `Forward local ports to the Pod that serves a device: for device/NAME the
broker Pod of its Instance on the Device's node or, without one, the
Device's mapper Pod; for instance/NAME a running broker Pod of the Instance.
The connection goes through the API server, as kubectl port-forward's does,
so it reaches edge nodes behind NAT through their link when the API server's
egress is Dowse's (see docs/design/edge-node.md).`,
		Example: `  kubectl dowse port-forward device/plc-1 8080
  kubectl dowse port-forward instance/camera-7f3a :554`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pod, err := c.servingPod(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return c.portForward(cmd.Context(), pod, addresses, args[1:])
		},
	}
	cmd.Flags().StringSliceVar(&addresses, "address", []string{"localhost"}, "local addresses to listen on")
	return cmd
}

// servingPod finds the running Pod that serves target.
func (c *cli) servingPod(ctx context.Context, target string) (*corev1.Pod, error) {
	kind, name, ok := strings.Cut(target, "/")
	if !ok || name == "" {
		return nil, usageErrorf("%q: name a device/NAME, instance/NAME or pod/NAME", target)
	}
	ns, err := c.namespace()
	if err != nil {
		return nil, err
	}
	cl, err := c.client()
	if err != nil {
		return nil, err
	}
	running := func(sel client.MatchingLabels) ([]corev1.Pod, error) {
		var pods corev1.PodList
		if err := cl.List(ctx, &pods, client.InNamespace(ns), sel); err != nil {
			return nil, err
		}
		return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool {
			return p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil
		}), nil
	}
	brokers := func(instance, node string) ([]corev1.Pod, error) {
		pods, err := running(client.MatchingLabels{v1alpha1.LabelInstance: v1alpha1.LabelValue(instance)})
		if err != nil {
			return nil, err
		}
		return slices.DeleteFunc(pods, func(p corev1.Pod) bool {
			return p.Labels[v1alpha1.LabelMapper] == "true" || (node != "" && p.Spec.NodeName != node)
		}), nil
	}
	switch strings.ToLower(kind) {
	case "pod", "pods", "po":
		var pod corev1.Pod
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pod); err != nil {
			return nil, err
		}
		return &pod, nil
	case "instance", "instances", "inst":
		pods, err := brokers(name, "")
		if err != nil {
			return nil, err
		}
		if len(pods) == 0 {
			return nil, fmt.Errorf("instance/%s in %s has no running broker Pod", name, ns)
		}
		return &pods[0], nil
	case "device", "devices", "dev":
		var dev v1alpha1.Device
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &dev); err != nil {
			return nil, err
		}
		instance := dev.Labels[v1alpha1.LabelInstance]
		if instance == "" {
			instance = dev.Name
		}
		pods, err := brokers(instance, dev.Spec.NodeName)
		if err != nil {
			return nil, err
		}
		if len(pods) == 0 && dev.Spec.MapperName != "" {
			if pods, err = running(client.MatchingLabels{v1alpha1.LabelMapper: "true",
				v1alpha1.LabelConfiguration: v1alpha1.LabelValue(dev.Spec.MapperName), v1alpha1.LabelNode: v1alpha1.LabelValue(dev.Spec.NodeName)}); err != nil {
				return nil, err
			}
		}
		if len(pods) == 0 {
			return nil, fmt.Errorf("device/%s in %s has no running broker or mapper Pod on its node %q", name, ns, dev.Spec.NodeName)
		}
		return &pods[0], nil
	}
	return nil, usageErrorf("%q: port-forward reaches a device/NAME, instance/NAME or pod/NAME, not a %s", target, kind)
}

// portForward forwards ports to pod through the API server, over a
// WebSocket tunnel with SPDY as the fallback, as kubectl does.
func (c *cli) portForward(ctx context.Context, pod *corev1.Pod, addresses, ports []string) error {
	cfg, err := c.config()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	u := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return err
	}
	spdyDialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	tunnel, err := portforward.NewSPDYOverWebsocketDialer(u, cfg)
	if err != nil {
		return err
	}
	dialer := portforward.NewFallbackDialer(tunnel, spdyDialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	fmt.Fprintf(c.streams.ErrOut, "Forwarding to pod/%s on node %s\n", pod.Name, pod.Spec.NodeName)
	fw, err := portforward.NewOnAddressesWithContext(ctx, dialer, addresses, ports, nil, c.streams.Out, c.streams.ErrOut)
	if err != nil {
		return err
	}
	return fw.ForwardPorts()
}
