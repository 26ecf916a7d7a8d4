// Package kube starts the real test control plane (etcd and kube-apiserver
// built by hack/build-k8s.sh) through controller-runtime's envtest, with
// Dowse's CRDs installed.
package kube

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// RepoRoot is the repository's top folder.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// BinDir holds kube-apiserver and etcd.
func BinDir() string { return filepath.Join(RepoRoot(), "bin", "k8s") }

// ControlPlane is a running API server with Dowse's CRDs.
type ControlPlane struct {
	env *envtest.Environment
	// certDir is the API server's, kept across RestartAPIServer so that
	// its serving and client CAs, and so every kubeconfig, stay valid.
	certDir string
	Config  *rest.Config
	// frontProxy is the front proxy's CA and client certificate
	// (Options.Aggregator).
	frontProxy frontProxyFiles
}

// FrontProxyClient is the API server's front proxy client certificate and
// key (files; empty without Options.Aggregator): what an aggregated API
// server trusts to name the user in X-Remote-User.
func (c *ControlPlane) FrontProxyClient() (certFile, keyFile string) {
	return c.frontProxy.cert, c.frontProxy.key
}

// Start starts etcd and kube-apiserver and installs the CRDs. The binaries
// must have been built: `make k8s` (or `make test`, which does it).
func Start() (*ControlPlane, error) { return StartWith(Options{CRDs: true}) }

// StartBare is Start without Dowse's CRDs: a bare API server, as a new
// user's cluster is before `kubectl apply -f deploy/crds`.
func StartBare() (*ControlPlane, error) { return StartWith(Options{}) }

// Options configure StartWith.
type Options struct {
	// CRDs installs Dowse's CRDs.
	CRDs bool
	// Aggregator configures the API server's front proxy for aggregated
	// APIs (APIServices) as kubeadm does: a front proxy CA of its own
	// (--requestheader-client-ca-file, published in
	// kube-system/extension-apiserver-authentication), the client
	// certificate the API server presents to aggregated API servers
	// (--proxy-client-cert-file, named FrontProxyClientName, the one
	// allowed name), and the X-Remote-User, X-Remote-Group and
	// X-Remote-Extra- headers.
	Aggregator bool
}

// FrontProxyClientName is the common name of the API server's front proxy
// client certificate (Options.Aggregator).
const FrontProxyClientName = "front-proxy-client"

// StartWith starts etcd and kube-apiserver as o says.
func StartWith(o Options) (*ControlPlane, error) { return start(o) }

func start(o Options) (*ControlPlane, error) {
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(BinDir(), b)); err != nil {
			return nil, fmt.Errorf("%s is missing from %s: run `make k8s` (hack/build-k8s.sh) to build the test control plane", b, BinDir())
		}
	}
	// A fresh API server on a loaded machine has dropped envtest's first
	// requests (a CRD's create ended in "unexpected EOF"); a second start
	// from nothing tells that from a real fault, which fails twice.
	cp, err := startOnce(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube: %v; starting a control plane again\n", err)
		cp, err = startOnce(o)
	}
	return cp, err
}

func startOnce(o Options) (*ControlPlane, error) {
	certDir, err := os.MkdirTemp("", "dowse-apiserver-")
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: BinDir(),
		// envtest's 20 s per start (retried 5 times) ran out on a loaded
		// 2-core machine.
		ControlPlaneStartTimeout: time.Minute,
	}
	if o.CRDs {
		env.CRDDirectoryPaths, env.ErrorIfCRDPathMissing = []string{CRDDir()}, true
	}
	env.ControlPlane.APIServer = &envtest.APIServer{CertDir: certDir}
	var files frontProxyFiles
	if o.Aggregator {
		var err error
		files, err = writeFrontProxyCerts(filepath.Join(certDir, "front-proxy"))
		if err != nil {
			_ = os.RemoveAll(certDir)
			return nil, err
		}
		args := env.ControlPlane.APIServer.Configure()
		args.Set("requestheader-client-ca-file", files.ca)
		args.Set("requestheader-allowed-names", FrontProxyClientName)
		args.Set("requestheader-username-headers", "X-Remote-User")
		args.Set("requestheader-group-headers", "X-Remote-Group")
		args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
		args.Set("proxy-client-cert-file", files.cert)
		args.Set("proxy-client-key-file", files.key)
	}
	// A data directory of ours, which envtest keeps when etcd stops (it
	// removes one it made), so that RestartEtcd finds the data again;
	// Stop removes it with certDir.
	env.ControlPlane.Etcd = &envtest.Etcd{DataDir: filepath.Join(certDir, "etcd")}
	cfg, err := env.Start()
	if err != nil {
		// A failure after etcd and the API server started (a CRD refused)
		// would otherwise leave them running.
		_ = env.Stop()
		_ = os.RemoveAll(certDir)
		return nil, fmt.Errorf("starting control plane: %w", err)
	}
	return &ControlPlane{env: env, certDir: certDir, Config: cfg, frontProxy: files}, nil
}

// StopAPIServer stops the API server (its watches end, clients see
// connections refused) until StartAPIServer; etcd and the data stay. An
// API server that does not stop within envtest's timeout is killed, as a
// crash would end it.
func (c *ControlPlane) StopAPIServer() error {
	api := c.env.ControlPlane.GetAPIServer()
	if err := api.Stop(); err != nil && !strings.Contains(err.Error(), "timeout waiting for process") {
		return fmt.Errorf("stopping the API server: %w", err)
	}
	// Killed: wait until its port is free again.
	addr := net.JoinHostPort(api.SecureServing.Address, api.SecureServing.Port)
	for deadline := time.Now().Add(30 * time.Second); ; {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return nil
		}
		conn.Close()
		if time.Now().After(deadline) {
			return fmt.Errorf("the stopped API server still listens on %s", addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// StartAPIServer starts a stopped API server again on the same address
// with the same certificates, so every client and kubeconfig still works.
func (c *ControlPlane) StartAPIServer() error {
	if err := c.env.ControlPlane.GetAPIServer().Start(); err != nil {
		return fmt.Errorf("starting the API server again: %w", err)
	}
	return nil
}

// RestartAPIServer is StopAPIServer then StartAPIServer.
func (c *ControlPlane) RestartAPIServer() error {
	if err := c.StopAPIServer(); err != nil {
		return err
	}
	return c.StartAPIServer()
}

// RestartEtcd stops etcd and starts it again on the same address with the
// same data, as a crash and restart of etcd would, under a running API
// server.
func (c *ControlPlane) RestartEtcd() error {
	etcd := c.env.ControlPlane.Etcd
	if err := etcd.Stop(); err != nil {
		return fmt.Errorf("stopping etcd: %w", err)
	}
	if err := etcd.Start(); err != nil {
		return fmt.Errorf("starting etcd again: %w", err)
	}
	return nil
}

// CRDDir holds Dowse's generated CRDs.
func CRDDir() string { return filepath.Join(RepoRoot(), "deploy", "crds") }

// InstallCRDs creates Dowse's CRDs on another API server (the test
// cluster's) and waits until they are served.
func InstallCRDs(cfg *rest.Config) error {
	_, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: []string{CRDDir()}, ErrorIfPathMissing: true})
	return err
}

// Stop stops the API server and etcd and removes their data.
func (c *ControlPlane) Stop() error {
	err := c.env.Stop()
	if rmErr := os.RemoveAll(c.certDir); err == nil {
		err = rmErr
	}
	return err
}

// Kubeconfig writes a kubeconfig for an admin user to path, for binaries
// started as separate processes.
func (c *ControlPlane) Kubeconfig(path string) error {
	return c.UserKubeconfig(path, "dowse-admin", "system:masters")
}

// UserKubeconfig writes a kubeconfig for the user name in groups (a client
// certificate of the API server's client CA) to path: what RBAC grants
// that user is all it may do.
func (c *ControlPlane) UserKubeconfig(path, name string, groups ...string) error {
	user, err := c.env.ControlPlane.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return err
	}
	b, err := user.KubeConfig()
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
