package dowsectl

import (
	"fmt"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/internal/agent/nodeapi"
	"github.com/dowse-dev/dowse/internal/version"
)

func newNodeCommand() *cobra.Command {
	node := &cobra.Command{Use: "node", Short: "Set up edge nodes", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	node.AddCommand(newNodeAutonomyCommand())
	return node
}

func newNodeAutonomyCommand() *cobra.Command {
	o := nodeapi.StaticPodOptions{Listen: agent.DefaultNodeAPIListen}
	cmd := &cobra.Command{
		Use:   "autonomy [--image IMAGE] [--upstream-kubeconfig PATH] [--cert-dir DIR]...",
		Short: "Print the static pod that lets a node run its pods through an offline reboot",
		Long: `Print the static pod of the node API proxy (dowse-agent node-api) for one
node. The proxy keeps what the node's kubelet and agent read from the API
server, on the node's disk, and answers them from it while the API server
cannot be reached, so that a node that reboots while cut off runs its pods
again. On the node:

  1. save this output in the kubelet's static pod folder
     (staticPodPath, /etc/kubernetes/manifests with kubeadm);
  2. once the proxy runs, it has written <dir>/kubelet.conf: start the
     kubelet with --kubeconfig=<dir>/kubelet.conf instead of its own;
  3. install the chart with nodeAPI.enabled=true, so that the agent reads
     through the proxy too.`,
		Example: "  dowsectl node autonomy > /etc/kubernetes/manifests/dowse-node-api.yaml",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Image == "" {
				o.Image = "ghcr.io/dowse-dev/dowse-agent:" + version.Get()
			}
			raw, err := yaml.Marshal(nodeapi.StaticPod(o))
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), string(raw))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Image, "image", "", "the agent's image (default: this dowsectl's version of ghcr.io/dowse-dev/dowse-agent)")
	f.StringVar(&o.UpstreamKubeconfig, "upstream-kubeconfig", "/etc/kubernetes/kubelet.conf", "the kubelet's own kubeconfig on the node")
	f.StringSliceVar(&o.CertDirs, "cert-dir", []string{"/var/lib/kubelet/pki"}, "folders on the node holding what that kubeconfig names (the kubelet's client certificate, the CA)")
	f.StringVar(&o.Dir, "dir", "/var/lib/dowse/node-api", "the proxy's folder on the node")
	f.StringVar(&o.PodResourcesDir, "pod-resources-dir", "/var/lib/kubelet/pod-resources", "the kubelet's pod-resources folder: offline, pods asking for Dowse devices are handed to the kubelet once it can allocate them (empty: at once)")
	f.StringVar(&o.Listen, "listen", o.Listen, "the loopback address the proxy serves the kubelet and the agent on")
	return cmd
}
