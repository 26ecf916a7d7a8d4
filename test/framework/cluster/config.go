package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

const (
	// From the benchmarking block, as the pod network's are (podnet.go).
	serviceCIDR = "198.19.0.0/24"
	serviceIP   = "198.19.0.1" // the kubernetes Service: first address of serviceCIDR
)

// containerdConfig is containerd 2.x's config (version 3). Everything it keeps
// lives under the state directory, runc's own state included, so Stop can find
// and unmount it all.
func containerdConfig(dir, runc, sandboxImage, cdiDir, cniConfDir, cniBinDir string) string {
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins."io.containerd.cri.v1.runtime"]
  # Setting a process's oom_score_adj below its own is refused on our
  # machines; without this every sandbox fails with "can't get final
  # child's PID from pipe".
  restrict_oom_score_adj = true
  cdi_spec_dirs = [%[5]q]
  # Pods' network namespaces under the state directory, where Stop finds
  # and unmounts what a stopped containerd left, not in the machine's
  # /run/netns.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%[6]q]
    conf_dir = %[7]q
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %[8]q
        Root = %[9]q
        SystemdCgroup = false

[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    # No image can be pulled here: the sandbox is our own pause image,
    # loaded from bin/images before the kubelet starts.
    sandbox = %[10]q

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`,
		filepath.Join(dir, "root"), filepath.Join(dir, "state"),
		filepath.Join(dir, "containerd.sock"), filepath.Join(dir, "containerd.sock.ttrpc"),
		cdiDir, cniBinDir, cniConfDir, runc, filepath.Join(dir, "runc"), sandboxImage)
}

// noPodNetworkCNI is a CNI config whose plugin does not exist. Pods of this
// node run with hostNetwork, so the CRI never calls a CNI plugin for them; but
// without any CNI config containerd reports NetworkReady=false, the kubelet
// marks the node NotReady, and the node lifecycle controller taints it
// node.kubernetes.io/not-ready:NoSchedule, which would block the scheduler
// for every pod that lacks a toleration (including the manifests in deploy/).
// A config is enough to make the network "ready"; a pod that does ask for a
// pod network fails at sandbox creation with a clear "plugin not found"
// instead of hanging in Pending.
const noPodNetworkCNI = `{
  "cniVersion": "1.0.0",
  "name": "dowse-host-network-only",
  "plugins": [{"type": "dowse-no-pod-network"}]
}
`

// kubeletConfig is the KubeletConfiguration the test node runs with; each
// unusual setting is one that was needed on the machines Dowse is tested
// on, and says why.
func kubeletConfig(o kubeletOpts) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The kubelet serves on loopback only, where the API server reaches it
# because the node's Hostname address is its name (see Options.NodeName); or,
# with a pod network, on the node's InternalIP.
address: %[7]s
port: %[1]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[2]d
containerRuntimeEndpoint: unix://%[3]s
# No systemd manages this machine's cgroups, and the container we run in may
# not let us build the QoS hierarchy or reserve node resources.
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
# Our machines run cgroup v1 (hybrid); kubelet 1.37 refuses it unless told.
failCgroupV1: false
# A test node: anyone on loopback may talk to the kubelet.
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
  x509:
    clientCAFile: %[4]q
authorization:
  mode: AlwaysAllow
# Our images cannot be pulled again once collected, and a busy build machine's
# disk must not evict test pods.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
podLogsDir: %[5]q
staticPodPath: %[8]q
resolvConf: ""
serializeImagePulls: false
registerNode: true
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: %[6]s
`, o.port, o.healthzPort, o.containerdSock, o.clientCA, o.podLogsDir, o.nodeStatusEvery, o.address, o.staticPodDir)
}

type kubeletOpts struct {
	address           string
	port, healthzPort int
	containerdSock    string
	clientCA          string
	podLogsDir        string
	nodeStatusEvery   time.Duration
	staticPodDir      string
}

// kubeconfig for the admin identity every component and test uses.
func kubeconfig(server string, p *pki) string {
	b64 := base64Std
	return strings.TrimSpace(fmt.Sprintf(`
apiVersion: v1
kind: Config
clusters:
- name: dowse
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: dowse-admin
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: dowse
  context:
    cluster: dowse
    user: dowse-admin
current-context: dowse
`, server, b64(p.caPEM), b64(p.adminPEM), b64(p.adminKPEM))) + "\n"
}

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o644)
}
