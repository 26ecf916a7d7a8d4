// Package kube starts the real test control plane (etcd and kube-apiserver
// built by hack/build-k8s.sh) through controller-runtime's envtest, with
// Dowse's CRDs installed.
package kube

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// RepoRoot is the repository's top folder.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// BinDir holds kube-apiserver and etcd.
func BinDir() string { return filepath.Join(RepoRoot(), "bin", "k8s") }

// ControlPlane is a running API server with Dowse's CRDs.
type ControlPlane struct {
	env    *envtest.Environment
	Config *rest.Config
}

// Start starts etcd and kube-apiserver and installs the CRDs. The binaries
// must have been built: `make k8s` (or `make test`, which does it).
func Start() (*ControlPlane, error) {
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(BinDir(), b)); err != nil {
			return nil, fmt.Errorf("%s is missing from %s: run `make k8s` (hack/build-k8s.sh) to build the test control plane", b, BinDir())
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: BinDir(),
		CRDDirectoryPaths:     []string{CRDDir()},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		// A failure after etcd and the API server started (a CRD refused)
		// would otherwise leave them running.
		_ = env.Stop()
		return nil, fmt.Errorf("starting control plane: %w", err)
	}
	return &ControlPlane{env: env, Config: cfg}, nil
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
func (c *ControlPlane) Stop() error { return c.env.Stop() }

// Kubeconfig writes a kubeconfig for an admin user to path, for binaries
// started as separate processes.
func (c *ControlPlane) Kubeconfig(path string) error {
	user, err := c.env.ControlPlane.AddUser(envtest.User{Name: "dowse-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	b, err := user.KubeConfig()
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
