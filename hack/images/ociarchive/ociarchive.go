// Package ociarchive writes OCI image archives (an OCI image layout in one tar
// file) holding a single static binary. There is no registry and no Docker
// engine on our machines, so images are made here and loaded straight into
// containerd; the same archive is what a user would push to a registry.
//
// The layout is written by hand with the standard library (an image of one
// binary needs one layer, a config and a manifest) to keep registry client
// dependencies out of the root module.
package ociarchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Media types of the OCI image spec v1.1.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"

	// annotationImageName is how containerd's importer learns the full
	// reference; org.opencontainers.image.ref.name carries only the tag.
	annotationImageName = "io.containerd.image.name"
	annotationRefName   = "org.opencontainers.image.ref.name"
)

// epoch is the modification time of every file in the image, so that the same
// binary always makes the same digests (a rebuilt archive is then a no-op for
// containerd).
var epoch = time.Unix(0, 0).UTC()

// Image describes an image of one binary.
type Image struct {
	// Ref is the full reference, e.g. ghcr.io/dowse-dev/dowse-agent:latest.
	Ref string
	// Binary is the path of a static executable on this machine.
	Binary string
	// Path is where the binary lives in the image; "/<base name>" if empty.
	Path string
	// Args follow the binary in the image's entrypoint.
	Args []string
	// Env is the image's environment, KEY=VALUE.
	Env []string
	// Arch is the GOARCH the binary was built for; runtime.GOARCH if empty.
	Arch string
	// Labels are the image config's labels (org.opencontainers.image.*).
	Labels map[string]string
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type blob struct {
	digest string
	data   []byte
}

func newBlob(data []byte) blob {
	sum := sha256.Sum256(data)
	return blob{digest: "sha256:" + hex.EncodeToString(sum[:]), data: data}
}

// Write writes img as an OCI image archive to out (written to a temporary
// file first and renamed, so a reader never sees half an archive).
func Write(out string, img Image) error {
	if !strings.Contains(img.Ref, ":") || strings.HasSuffix(img.Ref, ":") {
		return fmt.Errorf("image reference %q needs a tag", img.Ref)
	}
	tag := img.Ref[strings.LastIndex(img.Ref, ":")+1:]
	if strings.Contains(tag, "/") {
		return fmt.Errorf("image reference %q needs a tag", img.Ref)
	}
	if img.Path == "" {
		img.Path = "/" + filepath.Base(img.Binary)
	}
	if img.Arch == "" {
		img.Arch = runtime.GOARCH
	}
	bin, err := os.ReadFile(img.Binary)
	if err != nil {
		return err
	}
	layerTar, err := rootfs(img.Path, bin)
	if err != nil {
		return err
	}
	diffID := newBlob(layerTar).digest
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed) // header time stays zero: reproducible
	if _, err := zw.Write(layerTar); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	layer := newBlob(gz.Bytes())

	env := img.Env
	if len(env) == 0 {
		env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/"}
	}
	cfgJSON, err := json.Marshal(map[string]any{
		"architecture": img.Arch,
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config": map[string]any{
			"Entrypoint": append([]string{img.Path}, img.Args...),
			"Env":        env,
			"WorkingDir": "/",
			"Labels":     img.Labels,
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"history": []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "dowse hack/images"}},
	})
	if err != nil {
		return err
	}
	config := newBlob(cfgJSON)
	manJSON, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        descriptor{MediaType: mediaConfig, Digest: config.digest, Size: int64(len(config.data))},
		"layers":        []descriptor{{MediaType: mediaLayer, Digest: layer.digest, Size: int64(len(layer.data))}},
	})
	if err != nil {
		return err
	}
	manifest := newBlob(manJSON)
	indexJSON, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests": []descriptor{{
			MediaType:   mediaManifest,
			Digest:      manifest.digest,
			Size:        int64(len(manifest.data)),
			Annotations: map[string]string{annotationImageName: img.Ref, annotationRefName: tag},
			Platform:    &platform{Architecture: img.Arch, OS: "linux"},
		}},
	})
	if err != nil {
		return err
	}

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".ociarchive-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil { // CreateTemp makes 0600; images are not secret
		return err
	}
	tw := tar.NewWriter(tmp)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", indexJSON},
		{blobPath(config.digest), config.data},
		{blobPath(layer.digest), layer.data},
		{blobPath(manifest.digest), manifest.data},
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := writeFile(tw, f.name, 0o644, f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}

func blobPath(digest string) string { return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:") }

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
	if err := writeFile(tw, rel, 0o755, bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
		return err
	}
	_, err := io.Copy(tw, bytes.NewReader(data))
	return err
}
