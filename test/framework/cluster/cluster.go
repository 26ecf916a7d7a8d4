// Package cluster starts a real single-node Kubernetes cluster for tests and
// the demo: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// containerd (with Debian's runc) and a kubelet, all from bin/k8s (built by
// hack/build-k8s.sh), all under one state directory, talking on loopback.
// Images come from local OCI archives (hack/images/imagearchive, made with
// go-containerregistry), loaded with ctr; nothing is pulled.
//
// It needs root (the kubelet and runc mount, make cgroups and device nodes).
// Only one cluster can run on a machine at a time: the kubelet's device-plugin
// directory is fixed at /var/lib/kubelet/device-plugins. Start waits for
// another test run's cluster to stop (a lock under /run) instead of failing.
package cluster

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dowse-dev/dowse/dowsectl"
	"github.com/dowse-dev/dowse/hack/images/imagearchive"
	"github.com/dowse-dev/dowse/test/framework/kube"
)

// DevicePluginDir is where every kubelet looks for device plugins; it cannot
// be moved under the state directory.
const DevicePluginDir = "/var/lib/kubelet/device-plugins"

// PauseImage is the sandbox image the harness builds from hack/images/dowse-pause.
const PauseImage = "ghcr.io/dowse-dev/dowse-pause:latest"

// Options configure Start. The zero value is usable.
type Options struct {
	// StateDir holds everything the cluster writes; a new folder under /tmp
	// when empty (kept short: unix socket paths are limited to 108 bytes).
	StateDir string
	// BinDir holds the Kubernetes and containerd binaries; bin/k8s when empty.
	BinDir string
	// NodeName is the node's name. It is also the address the API server
	// dials to reach the kubelet (logs, exec), so it must resolve to
	// loopback: "localhost" when empty. Test traffic never leaves loopback.
	NodeName string
	// Images are OCI archives loaded into containerd before Start returns.
	Images []string
	// Detach lets the processes outlive the caller (dowse-cluster up);
	// otherwise they are killed if the caller dies without calling Stop.
	Detach bool
	// Timeout bounds Start; 3 minutes when zero.
	Timeout time.Duration
	// LockWait bounds the wait for another test cluster on this machine to
	// stop (30 minutes when zero); it does not count against Timeout.
	LockWait time.Duration
	// NodeStatusEvery is the kubelet's nodeStatusUpdateFrequency (how soon
	// a new device-plugin resource shows in the node's allocatable); 2s
	// when zero (the kubelet's own default is 10s).
	NodeStatusEvery time.Duration
	// PodNetwork gives the node a real pod network (see PodNetwork): the
	// node runs in a network namespace of its own, pods get addresses on a
	// bridge and reach Services through kube-proxy, and the control plane
	// listens on the machine's end of the link to it. Without it the node
	// is on the machine's network and only hostNetwork pods run.
	PodNetwork bool
	// Egress, when set, has the API server reach the cluster (nodes, pods,
	// Services) through an egress proxy on a Unix socket, Cluster.EgressUDS
	// (its EgressSelectorConfiguration's cluster egress, HTTPConnect), as
	// konnectivity or Dowse's controller serve it; until one listens there,
	// logs, exec and the pod proxy fail.
	Egress bool
	// EgressProtocol is the egress's proxy protocol when Egress is set:
	// dowsectl.ProtocolHTTPConnect (empty) or dowsectl.ProtocolGRPC. The
	// API server is given what `dowsectl egress-config --uds` prints.
	EgressProtocol string
	// StaticPods gives the kubelet a static pod folder, Cluster.StaticPodDir.
	StaticPods bool
}

// Cluster is a running cluster.
type Cluster struct {
	stopOnce sync.Once
	stopErr  error

	StateDir   string
	Kubeconfig string
	NodeName   string
	// CDIDir is containerd's CDI spec directory.
	CDIDir string
	// PodLogsDir is where the kubelet writes container logs.
	PodLogsDir string
	Config     *rest.Config
	Client     kubernetes.Interface
	// PodNetwork is the node's network when Options.PodNetwork was set.
	PodNetwork *PodNetwork
	// EgressUDS is where the API server's cluster egress goes when
	// Options.Egress was set.
	EgressUDS string
	// StaticPodDir is the kubelet's static pod folder when
	// Options.StaticPods was set.
	StaticPodDir string

	binDir         string
	containerdSock string
	procs          []*proc
	// machineLock is held from Start to Stop (nil when detached or attached).
	machineLock *os.File
	// restart starts the kubelet or containerd again as Start did (nil
	// after Attach).
	restart map[string]func() (*proc, error)
	// kubeletKubeconfig is what the kubelet reads (Kubeconfig unless
	// SetKubeletKubeconfig changed it).
	kubeletKubeconfig string
}

// Start brings the whole cluster up and returns once the node is registered
// and Ready, the default ServiceAccount exists and the images are loaded. On
// error everything started so far is stopped.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the test cluster needs root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return nil, errors.New("runc is missing: run hack/install-node-deps.sh (apt-get install runc)")
	}
	if o.BinDir == "" {
		o.BinDir = kube.BinDir()
	}
	bins := []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "containerd", "containerd-shim-runc-v2", "ctr"}
	if o.PodNetwork {
		bins = append(bins, "kube-proxy")
	}
	for _, b := range bins {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return nil, fmt.Errorf("%s is missing from %s: run `make k8s` (hack/build-k8s.sh)", b, o.BinDir)
		}
	}
	if o.NodeName == "" {
		o.NodeName = "localhost"
	}
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
	// One test cluster per machine (see DevicePluginDir): one of another
	// test run (another package, another checkout) is waited for rather
	// than failed on; a detached one (the demo's, dowse-cluster up) holds no
	// lock and is caught by the kubelet socket check below.
	var lock *os.File
	if !o.Detach {
		if lock, err = lockMachine(ctx, machineLockPath, o.LockWait); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				_ = lock.Close()
			}
		}()
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if o.StateDir == "" {
		if o.StateDir, err = os.MkdirTemp("/tmp", "dowse-cluster-"); err != nil {
			return nil, err
		}
	}
	if o.StateDir, err = filepath.Abs(o.StateDir); err != nil {
		return nil, err
	}
	// A reused state directory would mix a new CA with old etcd data.
	if ents, _ := os.ReadDir(o.StateDir); len(ents) > 0 {
		return nil, fmt.Errorf("state directory %s is not empty: stop its cluster and remove it first", o.StateDir)
	}
	// One kubelet per machine: they would share the device-plugin directory.
	if conn, err := net.DialTimeout("unix", filepath.Join(DevicePluginDir, "kubelet.sock"), time.Second); err == nil {
		conn.Close()
		return nil, fmt.Errorf("a kubelet already serves %s: only one test cluster can run on a machine", DevicePluginDir)
	}
	if !o.Detach {
		// A detached cluster outlives us, so its shims must not be ours.
		if err := becomeSubreaper(); err != nil {
			return nil, fmt.Errorf("becoming a child subreaper: %w", err)
		}
	}
	pause, err := BuildPauseImage(ctx)
	if err != nil {
		return nil, err
	}

	c := &Cluster{
		StateDir: o.StateDir, NodeName: o.NodeName, binDir: o.BinDir,
		Kubeconfig:     filepath.Join(o.StateDir, "kubeconfig"),
		CDIDir:         filepath.Join(o.StateDir, "cdi"),
		PodLogsDir:     filepath.Join(o.StateDir, "pod-logs"),
		containerdSock: filepath.Join(o.StateDir, "containerd", "containerd.sock"),
		machineLock:    lock,
	}
	defer func() {
		if err != nil {
			_ = c.Stop()
			err = fmt.Errorf("%w (logs in %s)", err, filepath.Join(o.StateDir, "logs"))
		}
	}()
	logs := filepath.Join(o.StateDir, "logs")
	for _, d := range []string{logs, c.CDIDir, c.PodLogsDir, filepath.Join(o.StateDir, "cni", "net.d"), filepath.Join(o.StateDir, "cni", "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	// The API server listens on loopback, or with a pod network where the
	// node's namespace reaches the machine.
	apiHost := "127.0.0.1"
	if o.PodNetwork {
		if c.PodNetwork, err = newPodNetwork(); err != nil {
			return nil, err
		}
		if err := writeJSON(filepath.Join(o.StateDir, podNetworkFile), c.PodNetwork); err != nil {
			return nil, err
		}
		apiHost = c.PodNetwork.HostIP
	}
	p, err := newPKI(filepath.Join(o.StateDir, "pki"), net.ParseIP(apiHost))
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(9)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, apiPort, kcmPort, schedPort, kubeletPort, kubeletHealthz := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5], ports[6]
	server := fmt.Sprintf("https://%s:%d", apiHost, apiPort)
	if err := writeFile(c.Kubeconfig, kubeconfig(server, p)); err != nil {
		return nil, err
	}
	env := append(os.Environ(), "PATH="+o.BinDir+":"+os.Getenv("PATH"))
	// command runs one of bin/k8s; the node's own processes run in its
	// network namespace when it has one.
	command := func(name string, args []string) (string, []string) {
		path := filepath.Join(o.BinDir, name)
		if c.PodNetwork != nil && (name == "containerd" || name == "kubelet" || name == "kube-proxy") {
			return c.PodNetwork.Command(path, args)
		}
		return path, args
	}
	c.restart = map[string]func() (*proc, error){}
	start := func(name string, args ...string) error {
		run := func() (*proc, error) {
			path, args := command(name, args)
			return startProc(name, path, args, env, filepath.Join(logs, name+".log"), o.Detach)
		}
		pr, err := run()
		if err != nil {
			return err
		}
		c.restart[name] = run
		c.procs = append(c.procs, pr)
		return writePids(filepath.Join(o.StateDir, "pids.json"), c.procs)
	}
	u := func(port int) string { return fmt.Sprintf("http://127.0.0.1:%d", port) }

	// containerd first: it loads the images while the control plane boots.
	ctrdDir := filepath.Join(o.StateDir, "containerd")
	runc, _ := exec.LookPath("runc")
	cniConf, cniBin := noPodNetworkCNI, filepath.Join(o.StateDir, "cni", "bin")
	if c.PodNetwork != nil {
		cniConf, cniBin = c.PodNetwork.cniConfig(o.StateDir), cniPluginDir
	}
	if err := writeFile(filepath.Join(o.StateDir, "cni", "net.d", "10-dowse.conflist"), cniConf); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(ctrdDir, "config.toml"), containerdConfig(ctrdDir, runc, PauseImage, c.CDIDir,
		filepath.Join(o.StateDir, "cni", "net.d"), cniBin)); err != nil {
		return nil, err
	}
	if err := start("containerd", "--config", filepath.Join(ctrdDir, "config.toml")); err != nil {
		return nil, err
	}

	if err := start("etcd", "--name", "default", "--data-dir", filepath.Join(o.StateDir, "etcd"),
		"--listen-client-urls", u(etcdClient), "--advertise-client-urls", u(etcdClient),
		"--listen-peer-urls", u(etcdPeer), "--initial-advertise-peer-urls", u(etcdPeer),
		"--initial-cluster", "default="+u(etcdPeer), "--unsafe-no-fsync", "--log-level", "warn"); err != nil {
		return nil, err
	}
	// A loopback advertise address is refused unless no endpoint reconciler
	// maintains the kubernetes Service's endpoints; with a pod network pods
	// reach the API server through that Service, at the machine's end of
	// the node's link.
	advertise := []string{"--advertise-address", "127.0.0.1", "--endpoint-reconciler-type", "none"}
	// The kubelet listens on loopback only; its Hostname address (the node
	// name) resolves there. With a pod network it listens on its InternalIP.
	kubeletAddress := "Hostname"
	if c.PodNetwork != nil {
		advertise = []string{"--advertise-address", c.PodNetwork.HostIP}
		kubeletAddress = "InternalIP"
	}
	if o.Egress {
		c.EgressUDS = filepath.Join(o.StateDir, "egress.sock")
		conf := filepath.Join(o.StateDir, "egress-selector.yaml")
		protocol := o.EgressProtocol
		if protocol == "" {
			protocol = dowsectl.ProtocolHTTPConnect
		}
		selector, err := dowsectl.EgressSelectorUDS(protocol, c.EgressUDS)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(conf, []byte(selector), 0o600); err != nil {
			return nil, err
		}
		advertise = append(advertise, "--egress-selector-config-file", conf)
	}
	if err := start("kube-apiserver", append(advertise,
		"--etcd-servers", u(etcdClient),
		"--bind-address", apiHost, "--secure-port", strconv.Itoa(apiPort),
		"--cert-dir", filepath.Join(o.StateDir, "pki"),
		"--tls-cert-file", p.servingCert, "--tls-private-key-file", p.servingKey,
		"--client-ca-file", p.caCert,
		"--service-cluster-ip-range", serviceCIDR,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p.saPub, "--service-account-signing-key-file", p.saKey,
		"--authorization-mode", "RBAC", "--allow-privileged=true",
		"--kubelet-preferred-address-types", kubeletAddress,
		"--kubelet-client-certificate", p.adminCert, "--kubelet-client-key", p.adminKey,
	)...); err != nil {
		return nil, err
	}
	// Wait for containerd before loading images; then load while the API
	// server starts.
	if err := waitForProcs(ctx, c.procs, "containerd", func() error { _, err := os.Stat(c.containerdSock); return err }); err != nil {
		return nil, err
	}
	loadErr := make(chan error, 1)
	go func() { loadErr <- c.LoadImages(ctx, append([]string{pause}, o.Images...)...) }()

	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	c.Config = cfg
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if err := waitForProcs(ctx, c.procs, "kube-apiserver /readyz", func() error {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%w: %s", err, body)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	auth := []string{"--kubeconfig", c.Kubeconfig, "--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig}
	if err := start("kube-controller-manager", append(auth,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(kcmPort),
		"--cert-dir", filepath.Join(o.StateDir, "kcm"),
		"--leader-elect=false",
		"--service-account-private-key-file", p.saKey, "--root-ca-file", p.caCert,
		"--service-cluster-ip-range", serviceCIDR)...); err != nil {
		return nil, err
	}
	if err := start("kube-scheduler", append(auth,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(schedPort),
		"--cert-dir", filepath.Join(o.StateDir, "scheduler"),
		"--leader-elect=false")...); err != nil {
		return nil, err
	}
	if c.PodNetwork != nil {
		cfg := filepath.Join(o.StateDir, "kube-proxy", "config.yaml")
		if err := writeFile(cfg, c.PodNetwork.kubeProxyConfig(c.Kubeconfig, o.NodeName, ports[7], ports[8])); err != nil {
			return nil, err
		}
		if err := start("kube-proxy", "--config", cfg); err != nil {
			return nil, err
		}
	}
	if err := <-loadErr; err != nil {
		return nil, err
	}
	kubeletDir := filepath.Join(o.StateDir, "kubelet")
	kubeletListen := "127.0.0.1"
	if c.PodNetwork != nil {
		kubeletListen = c.PodNetwork.NodeIP
	}
	if o.StaticPods {
		c.StaticPodDir = filepath.Join(o.StateDir, "manifests")
		if err := os.MkdirAll(c.StaticPodDir, 0o755); err != nil {
			return nil, err
		}
	}
	if err := writeFile(filepath.Join(kubeletDir, "config.yaml"), kubeletConfig(kubeletOpts{
		staticPodDir: c.StaticPodDir,
		address:      kubeletListen, port: kubeletPort, healthzPort: kubeletHealthz, containerdSock: c.containerdSock,
		clientCA: p.caCert, podLogsDir: c.PodLogsDir, nodeStatusEvery: cmp.Or(o.NodeStatusEvery, 2*time.Second),
	})); err != nil {
		return nil, err
	}
	c.kubeletKubeconfig = c.Kubeconfig
	kubeletArgs := func() []string {
		args := []string{"--config", filepath.Join(kubeletDir, "config.yaml"),
			"--kubeconfig", c.kubeletKubeconfig, "--root-dir", kubeletDir,
			"--cert-dir", filepath.Join(kubeletDir, "pki"),
			"--hostname-override", o.NodeName}
		if c.PodNetwork != nil {
			args = append(args, "--node-ip", c.PodNetwork.NodeIP)
		}
		return args
	}
	if err := start("kubelet", kubeletArgs()...); err != nil {
		return nil, err
	}
	// The kubelet starts again with the kubeconfig of the moment.
	c.restart["kubelet"] = func() (*proc, error) {
		path, args := command("kubelet", kubeletArgs())
		return startProc("kubelet", path, args, env, filepath.Join(logs, "kubelet.log"), o.Detach)
	}
	if err := waitForProcs(ctx, c.procs, "node "+o.NodeName+" Ready", func() error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, o.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				for _, t := range n.Spec.Taints {
					if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
						return fmt.Errorf("node tainted %s", t.Key)
					}
				}
				return nil
			}
		}
		return errors.New("node not Ready")
	}); err != nil {
		return nil, err
	}
	// Pods are refused by admission until the controller manager has made the
	// namespace's ServiceAccount.
	if err := waitForProcs(ctx, c.procs, "default ServiceAccount", func() error {
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// RestartKubelet stops the kubelet and starts it again, as an upgrade or a
// crash would: containers keep running, and the kubelet recreates
// kubelet.sock in the device-plugin directory, which plugins must notice to
// register again. It returns once the new kubelet serves that socket.
func (c *Cluster) RestartKubelet(ctx context.Context) error {
	i, err := c.procIndex("kubelet")
	if err != nil {
		return err
	}
	c.procs[i].StopWithin(10 * time.Second)
	// The old socket file stays behind; waiting for a fresh one below needs
	// it gone.
	_ = os.Remove(filepath.Join(DevicePluginDir, "kubelet.sock"))
	return c.startAgain(ctx, "kubelet")
}

// RestartControlPlane stops the control plane's etcd or kube-apiserver as
// an outage would, keeps it away for away, and starts it again with its
// data; it returns once the process is started, not serving.
func (c *Cluster) RestartControlPlane(ctx context.Context, name string, away time.Duration) error {
	if name != "etcd" && name != "kube-apiserver" {
		return fmt.Errorf("RestartControlPlane restarts etcd or kube-apiserver, not %s", name)
	}
	i, err := c.procIndex(name)
	if err != nil {
		return err
	}
	c.procs[i].StopWithin(10 * time.Second)
	select {
	case <-time.After(away):
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.startAgain(ctx, name)
}

// SetKubeletKubeconfig has the kubelet read path from its next start on
// (RestartKubelet, Reboot), as a node pointed at a proxy of the API server
// would.
func (c *Cluster) SetKubeletKubeconfig(path string) { c.kubeletKubeconfig = path }

// Reboot stops the node as a power cut would and starts it again: the
// kubelet and containerd stop, every container and shim is killed, the
// runtime state a reboot clears (containerd's state folder, the pods'
// mounts, network namespaces and tmpfs volumes) is gone; then containerd
// and the kubelet start again, with what is on disk (images, the kubelet's
// folder, static pod manifests). The node's network namespace and its
// rules stay: they stand for the network outside the node.
func (c *Cluster) Reboot(ctx context.Context) error {
	k, err := c.procIndex("kubelet")
	if err != nil {
		return err
	}
	ctrd, err := c.procIndex("containerd")
	if err != nil {
		return err
	}
	c.procs[k].Kill()
	killShims(c.containerdSock)
	c.procs[ctrd].Kill()
	killShims(c.containerdSock)
	reapShims()
	if err := unmountAll(c.StateDir); err != nil {
		return fmt.Errorf("reboot: %w", err)
	}
	if err := os.RemoveAll(filepath.Join(c.StateDir, "containerd", "state")); err != nil {
		return fmt.Errorf("reboot: %w", err)
	}
	_ = os.Remove(filepath.Join(DevicePluginDir, "kubelet.sock"))
	_ = os.Remove(c.containerdSock)
	if err := c.startAgain(ctx, "containerd"); err != nil {
		return err
	}
	if err := waitForProcs(ctx, []*proc{c.procs[ctrd]}, "containerd", func() error {
		conn, err := net.DialTimeout("unix", c.containerdSock, time.Second)
		if err != nil {
			return err
		}
		return conn.Close()
	}); err != nil {
		return err
	}
	return c.startAgain(ctx, "kubelet")
}

func (c *Cluster) procIndex(name string) (int, error) {
	if c.restart == nil {
		return -1, fmt.Errorf("this cluster was attached, not started here: it cannot restart its %s", name)
	}
	for i, p := range c.procs {
		if p.Name == name {
			return i, nil
		}
	}
	return -1, fmt.Errorf("no %s to restart", name)
}

// startAgain starts a stopped process as Start did; for the kubelet it
// returns once the kubelet serves its device-plugin socket.
func (c *Cluster) startAgain(ctx context.Context, name string) error {
	i, err := c.procIndex(name)
	if err != nil {
		return err
	}
	p, err := c.restart[name]()
	if err != nil {
		return err
	}
	c.procs[i] = p
	if err := writePids(filepath.Join(c.StateDir, "pids.json"), c.procs); err != nil {
		return err
	}
	if name != "kubelet" {
		return nil
	}
	sock := filepath.Join(DevicePluginDir, "kubelet.sock")
	return waitForProcs(ctx, []*proc{p}, "kubelet.sock", func() error {
		conn, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			return err
		}
		return conn.Close()
	})
}

// Attach finds the cluster a detached Start left in stateDir, to stop it.
func Attach(stateDir string) (*Cluster, error) {
	procs, err := readPids(filepath.Join(stateDir, "pids.json"))
	if err != nil {
		return nil, err
	}
	c := &Cluster{StateDir: stateDir, Kubeconfig: filepath.Join(stateDir, "kubeconfig"), procs: procs,
		containerdSock: filepath.Join(stateDir, "containerd", "containerd.sock"), binDir: kube.BinDir()}
	if raw, err := os.ReadFile(filepath.Join(stateDir, podNetworkFile)); err == nil {
		c.PodNetwork = &PodNetwork{}
		if err := json.Unmarshal(raw, c.PodNetwork); err != nil {
			return nil, fmt.Errorf("%s: %w", podNetworkFile, err)
		}
	}
	return c, nil
}

// LoadImages imports OCI archives into containerd's k8s.io namespace, where
// the CRI (and so the kubelet) finds them.
func (c *Cluster) LoadImages(ctx context.Context, archives ...string) error {
	for _, a := range archives {
		out, err := exec.CommandContext(ctx, filepath.Join(c.binDir, "ctr"), "--address", c.containerdSock,
			"--namespace", "k8s.io", "images", "import", "--local", a).CombinedOutput()
		if err != nil {
			return fmt.Errorf("loading %s: %w: %s", a, err, out)
		}
	}
	return nil
}

// Stop stops every process the cluster started, the containers' shims and
// processes, and unmounts what they left under the state directory. The state
// directory itself is kept (it holds the logs); RemoveAll it when done.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() { c.stopErr = c.stop() })
	return c.stopErr
}

func (c *Cluster) stop() error {
	var errs []error
	// The kubelet first so that it restarts nothing; the control plane and
	// containerd in reverse start order.
	byName := map[string]*proc{}
	for _, p := range c.procs {
		byName[p.Name] = p
	}
	if p := byName["kubelet"]; p != nil {
		p.StopWithin(10 * time.Second)
		// The device-plugin directory is the machine's, not ours: the next
		// cluster's kubelet would restore this one's resources from the
		// checkpoint and list them on its node.
		if !p.Alive() {
			_ = os.Remove(filepath.Join(DevicePluginDir, "kubelet_internal_checkpoint"))
			_ = os.Remove(filepath.Join(DevicePluginDir, "kubelet.sock"))
		}
	}
	killShims(c.containerdSock)
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].StopWithin(10 * time.Second)
	}
	// A shim that was starting while containerd stopped: look once more.
	killShims(c.containerdSock)
	reapShims()
	for _, p := range c.procs {
		if p.Alive() {
			errs = append(errs, fmt.Errorf("%s (pid %d) did not stop", p.Name, p.Pid()))
		}
	}
	if err := unmountAll(c.StateDir); err != nil {
		errs = append(errs, err)
	}
	// The namespace last: containerd and the pods' network namespaces
	// (mounted under the state directory) are gone by now.
	if c.PodNetwork != nil {
		if err := c.PodNetwork.delete(); err != nil {
			errs = append(errs, err)
		}
	}
	// The kubelet links every container log into /var/log/containers (a
	// path no setting moves); the links point into our state directory.
	for _, l := range c.logLinks() {
		_ = os.Remove(l)
	}
	// runc leaves the empty parent cgroup of the k8s.io namespace behind;
	// rmdir only removes it when nothing else lives in it.
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io")
	for _, cg := range cgs {
		_ = syscall.Rmdir(cg)
	}
	if c.machineLock != nil && len(errs) == 0 {
		// Held on when something did not stop: the next cluster would
		// meet it.
		_ = c.machineLock.Close()
	}
	return errors.Join(errs...)
}

// logLinks are the kubelet's links in /var/log/containers into our state
// directory.
func (c *Cluster) logLinks() []string {
	ents, _ := os.ReadDir(varLogContainers)
	var out []string
	for _, e := range ents {
		l := filepath.Join(varLogContainers, e.Name())
		if t, err := os.Readlink(l); err == nil && strings.HasPrefix(t, c.StateDir+"/") {
			out = append(out, l)
		}
	}
	return out
}

const varLogContainers = "/var/log/containers"

// Pids lists the process ids the cluster started.
func (c *Cluster) Pids() map[string]int {
	out := map[string]int{}
	for _, p := range c.procs {
		out[p.Name] = p.Pid()
	}
	return out
}

// Leftovers lists what of this cluster still runs or is mounted: processes it
// started, shims of its containerd, mounts under its state directory. Empty
// after a clean Stop.
func (c *Cluster) Leftovers() []string {
	var out []string
	for _, p := range c.procs {
		if p.Alive() {
			out = append(out, fmt.Sprintf("process %s (pid %d)", p.Name, p.Pid()))
		}
	}
	for _, s := range shimsOf(c.containerdSock) {
		out = append(out, fmt.Sprintf("shim pid %d", s.pid))
	}
	mps, _ := MountsUnder(c.StateDir)
	for _, m := range mps {
		out = append(out, "mount "+m)
	}
	for _, l := range c.logLinks() {
		out = append(out, "log link "+l)
	}
	if c.PodNetwork != nil {
		out = append(out, c.PodNetwork.leftovers()...)
	}
	return out
}

// BuildPauseImage builds bin/images/dowse-pause.tar and returns its path.
func BuildPauseImage(ctx context.Context) (string, error) {
	return BuildImage(ctx, "./hack/images/dowse-pause", "dowse-pause", PauseImage)
}

// BuildImage builds the Go main package pkg (relative to the repository)
// statically and writes bin/images/<name>.tar tagged ref. It always rebuilds:
// Go's build cache and the reproducible archive make that about a second, and
// an archive left from older code would test the wrong thing.
func BuildImage(ctx context.Context, pkg, name, ref string) (string, error) {
	out := filepath.Join(kube.RepoRoot(), "bin", "images", name+".tar")
	bin := filepath.Join(kube.RepoRoot(), "bin", "static", name)
	version := imageVersion(ctx)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath",
		"-ldflags=-s -w -X github.com/dowse-dev/dowse/internal/version.version="+version, "-o", bin, pkg)
	cmd.Dir = kube.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w: %s", pkg, err, b)
	}
	if err := imagearchive.Write(out, imagearchive.Image{Ref: ref, Binary: bin, Labels: imagearchive.Labels(name, version)}); err != nil {
		return "", err
	}
	return out, nil
}

// imageVersion is the version BuildImage stamps, as the Makefile's VERSION
// says it: git describe of the tree, else "dev".
func imageVersion(ctx context.Context) string {
	cmd := exec.CommandContext(ctx, "git", "describe", "--tags", "--always", "--dirty")
	cmd.Dir = kube.RepoRoot()
	if out, err := cmd.Output(); err == nil && len(strings.TrimSpace(string(out))) > 0 {
		return strings.TrimSpace(string(out))
	}
	return "dev"
}

// waitForProcs polls check until it succeeds or ctx ends, and gives up at once
// when one of procs has exited: a component that failed to start would
// otherwise cost the whole timeout.
func waitForProcs(ctx context.Context, ps []*proc, what string, check func() error) error {
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		for _, p := range ps {
			if !p.Alive() {
				return fmt.Errorf("waiting for %s: %s exited (see its log)", what, p.Name)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %w)", what, context.Cause(ctx), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// freePorts reserves n distinct loopback ports. They are released before the
// components bind them; on a test machine the race is acceptable.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

func base64Std(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// podNetworkFile keeps the node's network in the state directory, for Attach.
const podNetworkFile = "podnet.json"

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeFile(path, string(b))
}

// RunningContainers lists the node's running containers, pod sandboxes left
// out, as "namespace/pod/container" to container id: what runs on the node
// whatever the API server says.
func (c *Cluster) RunningContainers(ctx context.Context) (map[string]string, error) {
	tasks, err := c.runningTasks(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for k, t := range tasks {
		out[k] = t.id
	}
	return out, nil
}

// KillContainer kills with SIGKILL the main process of the running
// container namespace/pod/container on the node (its task's process, as
// containerd knows it: the image's entrypoint), as an out-of-memory kill or
// a crash would end it; the kubelet restarts it as the Pod's restartPolicy
// says. It returns the process id killed.
func (c *Cluster) KillContainer(ctx context.Context, namespace, pod, container string) (int, error) {
	tasks, err := c.runningTasks(ctx)
	if err != nil {
		return 0, err
	}
	key := namespace + "/" + pod + "/" + container
	t, ok := tasks[key]
	if !ok || t.pid <= 0 {
		return 0, fmt.Errorf("no running container %s on the node", key)
	}
	if err := syscall.Kill(t.pid, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("killing %s (pid %d): %w", key, t.pid, err)
	}
	return t.pid, nil
}

type task struct {
	id  string
	pid int
}

// runningTasks lists the node's running containers (not sandboxes) by
// "namespace/pod/container", with their ids and main processes.
func (c *Cluster) runningTasks(ctx context.Context) (map[string]task, error) {
	ctr := func(args ...string) ([]byte, error) {
		out, err := exec.CommandContext(ctx, filepath.Join(c.binDir, "ctr"), append([]string{"--address", c.containerdSock,
			"--namespace", "k8s.io"}, args...)...).Output()
		if err != nil {
			return nil, fmt.Errorf("ctr %s: %w", strings.Join(args, " "), err)
		}
		return out, nil
	}
	tasks, err := ctr("tasks", "ls")
	if err != nil {
		return nil, err
	}
	out := map[string]task{}
	for line := range strings.SplitSeq(string(tasks), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "RUNNING" {
			continue
		}
		raw, err := ctr("containers", "info", f[0])
		if err != nil {
			continue // gone meanwhile
		}
		var info struct{ Labels map[string]string }
		if err := json.Unmarshal(raw, &info); err != nil {
			return nil, err
		}
		l := info.Labels
		if l["io.cri-containerd.kind"] != "container" {
			continue
		}
		pid, _ := strconv.Atoi(f[1])
		out[l["io.kubernetes.pod.namespace"]+"/"+l["io.kubernetes.pod.name"]+"/"+l["io.kubernetes.container.name"]] = task{id: f[0], pid: pid}
	}
	return out, nil
}
