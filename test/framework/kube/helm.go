package kube

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequireHelm returns bin/helm's path. Without it the test is skipped, or
// fails under CI (CI=true): CI must build it.
func RequireHelm(t testing.TB) string {
	t.Helper()
	path := filepath.Join(RepoRoot(), "bin", "helm")
	if _, err := os.Stat(path); err != nil {
		msg := "bin/helm is missing: run `make helm` (hack/build-helm.sh builds Helm from the Go module proxy)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

// HelmCommand is bin/helm with args (RequireHelm), its caches and config in
// a folder of the test's own.
func HelmCommand(ctx context.Context, t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, RequireHelm(t), args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	return cmd
}
