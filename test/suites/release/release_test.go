// Package release tests `make release` end to end: two commands built for
// linux/amd64 and linux/arm64 become one image index each in the release's
// OCI layout and images.txt, every arm64 binary is an AArch64 ELF, the
// layout is pushed to go-containerregistry's in-process registry, and the
// chart packaged by the release is pushed there too and installed from it
// with `helm install oci://…` onto a real API server.
package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dowse-dev/dowse/test/framework/kube"
)

// The release test builds these two (small) commands; the chart's other
// images are checked to be commands a full release builds.
var cmds = []string{"./discovery-handlers/debug-echo/cmd/dowse-debug-echo-discovery", "./brokers/debug-echo/cmd/dowse-debug-echo-broker"}

const version = "0.1.0-test.1"

func TestRelease(t *testing.T) {
	kube.RequireHelm(t)
	root := kube.RepoRoot()
	out := t.TempDir()
	start := time.Now()
	make := exec.Command("make", "--no-print-directory", "release", "RELEASE_DIR="+out, "RELEASE_VERSION="+version, "RELEASE_CMDS="+strings.Join(cmds, " "))
	make.Dir = root
	if b, err := make.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, b)
	} else {
		t.Logf("make release (2 commands, 2 platforms) in %v:\n%s", time.Since(start).Round(time.Second), b)
	}

	// images.txt names each image once, tagged with the version.
	b, err := os.ReadFile(filepath.Join(out, "images.txt"))
	if err != nil {
		t.Fatal(err)
	}
	refs := strings.Fields(string(b))
	want := []string{"ghcr.io/dowse-dev/dowse-debug-echo-broker:" + version, "ghcr.io/dowse-dev/dowse-debug-echo-discovery:" + version}
	if !slices.Equal(refs, want) {
		t.Fatalf("images.txt = %v, want %v", refs, want)
	}

	// Each is one index of two platforms; each binary is of its platform.
	lp, err := layout.FromPath(filepath.Join(out, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	rootIdx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	rim, err := rootIdx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(rim.Manifests) != len(want) {
		t.Fatalf("layout has %d entries, want %d", len(rim.Manifests), len(want))
	}
	for _, d := range rim.Manifests {
		idx, err := rootIdx.ImageIndex(d.Digest)
		if err != nil {
			t.Fatalf("%s: not an index: %v", d.Annotations, err)
		}
		checkPlatforms(t, d.Annotations["io.containerd.image.name"], idx)
	}

	// Pushed to a registry: go-containerregistry's, in-process.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	push := exec.Command("go", "run", "./hack/images", "push", "-layout", filepath.Join(out, "oci"), "-registry", host+"/dowse-dev", "-insecure")
	push.Dir = root
	if b, err := push.CombinedOutput(); err != nil {
		t.Fatalf("images push: %v\n%s", err, b)
	}
	for _, r := range want {
		ref, err := name.NewTag(strings.Replace(r, "ghcr.io", host, 1), name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		idx, err := remote.Index(ref)
		if err != nil {
			t.Fatalf("%s not in the registry: %v", ref, err)
		}
		checkPlatforms(t, ref.String(), idx)
	}

	// The packaged chart: its version and default tag the release's.
	chart := filepath.Join(out, "dowse-"+version+".tgz")
	helm := func(args ...string) string {
		t.Helper()
		b, err := kube.HelmCommand(context.Background(), t, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return string(b)
	}
	if show := helm("show", "chart", chart); !strings.Contains(show, "version: "+version) || !strings.Contains(show, "appVersion: "+version) {
		t.Fatalf("packaged chart:\n%s", show)
	}
	t.Log(helm("push", chart, "oci://"+host+"/charts", "--plain-http"))

	cp, err := kube.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.Kubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	// --no-hooks: the hooks are Jobs, and no node runs them here.
	t.Log(helm("install", "dowse", "oci://"+host+"/charts/dowse", "--version", version, "--plain-http", "--no-hooks",
		"--namespace", "dowse-release", "--create-namespace", "--kubeconfig", kubeconfig,
		"--set", "image.registry="+host+"/dowse-dev", "--set", "debugEcho.discovery.enabled=true"))
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	ds, err := cs.AppsV1().DaemonSets("dowse-release").Get(context.Background(), "dowse-debug-echo-discovery", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	img := ds.Spec.Template.Spec.Containers[0].Image
	if img != host+"/dowse-dev/dowse-debug-echo-discovery:"+version {
		t.Errorf("installed DaemonSet's image %s, want the release's in the registry", img)
	}
	ref, err := name.ParseReference(img, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Index(ref); err != nil {
		t.Errorf("the installed release's image %s is not in the registry: %v", img, err)
	}
	if _, err := cs.AppsV1().Deployments("dowse-release").Get(context.Background(), "dowse-controller", metav1.GetOptions{}); err != nil {
		t.Errorf("the installed release has no controller: %v", err)
	}

	// Every image the chart can reference is a command a full release
	// builds (so in its images.txt).
	list := exec.Command("go", "list", "-f", "{{if eq .Name \"main\"}}{{.ImportPath}}{{end}}", "./...")
	list.Dir = root
	lb, err := list.Output()
	if err != nil {
		t.Fatal(err)
	}
	built := map[string]bool{}
	for _, p := range strings.Fields(string(lb)) {
		if strings.Contains(p, "/cmd/dowse-") && !strings.Contains(p, "/test/") {
			built[p[strings.LastIndex(p, "/")+1:]] = true
		}
	}
	rendered := helm("template", "dowse", filepath.Join(root, "deploy", "helm", "dowse"), "--values", filepath.Join(root, "deploy", "helm", "dowse", "ci", "all-on-values.yaml"))
	for _, line := range strings.Split(rendered, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "- "))
		v, ok := strings.CutPrefix(line, "image: ")
		if !ok || !strings.HasPrefix(v, "ghcr.io/dowse-dev/") {
			continue
		}
		n := strings.TrimPrefix(v[:strings.LastIndex(v, ":")], "ghcr.io/dowse-dev/")
		if !built[n] {
			t.Errorf("the chart references %s, which no release builds (%v)", v, built)
		}
	}
}

// checkPlatforms: the index has exactly linux/amd64 and linux/arm64, and
// each image's binary is an ELF executable of its architecture.
func checkPlatforms(t *testing.T, what string, idx v1.ImageIndex) {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var plats []string
	for _, m := range im.Manifests {
		if m.Platform == nil {
			t.Fatalf("%s: a manifest without a platform", what)
		}
		plats = append(plats, m.Platform.OS+"/"+m.Platform.Architecture)
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != m.Platform.Architecture || cf.OS != "linux" {
			t.Errorf("%s %s: config says %s/%s", what, m.Platform.Architecture, cf.OS, cf.Architecture)
		}
		machine := elfMachine(t, img, cf.Config.Entrypoint[0])
		if want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[m.Platform.Architecture]; machine != want {
			t.Errorf("%s %s: the binary is for %s, want %s", what, m.Platform.Architecture, machine, want)
		}
	}
	slices.Sort(plats)
	if !slices.Equal(plats, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("%s: platforms %v, want linux/amd64 and linux/arm64", what, plats)
	}
}

// elfMachine reads the entrypoint binary out of the image's layer and
// returns its ELF header's machine.
func elfMachine(t *testing.T, img v1.Image, path string) elf.Machine {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers: %v", len(layers), err)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("no %s in the layer", path)
		}
		if err != nil {
			t.Fatal(err)
		}
		if "/"+strings.TrimPrefix(h.Name, "/") != path {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		f, err := elf.NewFile(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return f.Machine
	}
}
