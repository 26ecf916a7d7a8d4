// Package imagearchive makes OCI image archives (an OCI image layout in one
// tar file) of a single static binary, with go-containerregistry. There is
// no registry and no Docker engine on our machines, so images are made here
// and loaded straight into containerd (`ctr -n k8s.io images import`); the
// same layout, unpacked, is what a user would push to a registry
// (`crane push DIR`).
package imagearchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations of the layout's index entry: containerd's importer takes the
// full reference from AnnotationImageName (the OCI ref.name carries only the
// tag, as the image spec says).
const (
	AnnotationImageName = "io.containerd.image.name"
	AnnotationRefName   = "org.opencontainers.image.ref.name"
)

// epoch is the time of every file and of the image itself, so that the same
// binary always makes the same digests (a rebuilt archive is then a no-op
// for containerd).
var epoch = time.Unix(0, 0).UTC()

// Image describes an image of one binary.
type Image struct {
	// Ref is the full reference with a tag, e.g.
	// ghcr.io/dowse-dev/dowse-agent:latest.
	Ref string
	// Binary is the path of a static executable on this machine.
	Binary string
	// Path is where the binary lives in the image; "/<base name>" if empty.
	Path string
	// Args follow the binary in the image's entrypoint.
	Args []string
	// Env is the image's environment, KEY=VALUE; a PATH when empty.
	Env []string
	// Arch is the GOARCH the binary was built for; runtime.GOARCH if empty.
	Arch string
	// Labels are the image config's labels (org.opencontainers.image.*).
	Labels map[string]string
}

// Labels are the labels of a Dowse image of binary name: its title,
// version (the one stamped into the binary for --version), source and
// licence, in the OCI annotation keys.
func Labels(name, version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":    name,
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.source":   "https://github.com/dowse-dev/dowse",
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
}

// Write writes img as an OCI image archive to out (through a temporary file
// renamed at the end, so a reader never sees half an archive).
func Write(out string, img Image) error {
	ref, err := name.NewTag(img.Ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image reference %q needs a registry, a repository and a tag: %w", img.Ref, err)
	}
	if img.Path == "" {
		img.Path = "/" + filepath.Base(img.Binary)
	}
	if img.Arch == "" {
		img.Arch = runtime.GOARCH
	}
	if len(img.Env) == 0 {
		img.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/"}
	}
	v1img, err := build(img)
	if err != nil {
		return err
	}

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(filepath.Dir(out), ".imagearchive-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendImage(v1img,
		layout.WithAnnotations(map[string]string{AnnotationImageName: ref.String(), AnnotationRefName: ref.TagStr()}),
		layout.WithPlatform(v1.Platform{OS: "linux", Architecture: img.Arch})); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "image.tar")
	if err := tarDir(tmp, filepath.Join(dir, "layout")); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// build is the image: one gzip layer holding the binary, and a config with
// its entrypoint and labels, all in OCI media types.
func build(img Image) (v1.Image, error) {
	bin, err := os.ReadFile(img.Binary)
	if err != nil {
		return nil, err
	}
	rootfs, err := rootfs(img.Path, bin)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(rootfs)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	withLayer, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "dowse hack/images (go-containerregistry)"}})
	if err != nil {
		return nil, err
	}
	cf, err := withLayer.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = img.Arch, "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = append([]string{img.Path}, img.Args...)
	cf.Config.Env = img.Env
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = img.Labels
	return mutate.ConfigFile(withLayer, cf)
}

// rootfs is the uncompressed layer: the parent directories of path, /tmp
// (programs expect it), and the binary.
func rootfs(path string, bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	rel := strings.TrimPrefix(filepath.Clean(path), "/")
	dirs := []string{"tmp/"}
	for d := filepath.Dir(rel); d != "."; d = filepath.Dir(d) {
		dirs = append(dirs, d+"/")
	}
	for _, d := range dirs {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o755, Size: int64(len(bin)), ModTime: epoch}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir packs the layout folder into one file, in name order with fixed
// times and modes, so that the archive's bytes depend on its content alone.
func tarDir(out, dir string) error {
	var paths []string
	if err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err == nil && p != dir {
			paths = append(paths, p)
		}
		return err
	}); err != nil {
		return err
	}
	slices.Sort(paths)
	f, err := os.OpenFile(out, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, p := range paths {
		rel, _ := filepath.Rel(dir, p)
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.IsDir() {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: filepath.ToSlash(rel) + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return err
			}
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: filepath.ToSlash(rel), Mode: 0o644, Size: st.Size(), ModTime: epoch}); err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, src)
		src.Close()
		if err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
