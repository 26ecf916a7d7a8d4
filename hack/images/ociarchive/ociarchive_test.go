package ociarchive

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWrite checks the archive is a well-formed OCI layout: every blob's name
// is its digest, the index names the image the way containerd's importer
// reads it, and writing twice gives the same bytes.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!not really a binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "a.tar")
	img := Image{Ref: "ghcr.io/dowse-dev/tool:v1", Binary: bin, Labels: map[string]string{"org.opencontainers.image.version": "v1.2.3"}}
	if err := Write(out, img); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
	for name, b := range files {
		if d, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && d != "" {
			sum := sha256.Sum256(b)
			if hex.EncodeToString(sum[:]) != d {
				t.Errorf("blob %s has digest %x", name, sum)
			}
		}
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations[annotationImageName] != img.Ref || index.Manifests[0].Annotations[annotationRefName] != "v1" {
		t.Fatalf("index = %s", files["index.json"])
	}
	if _, ok := files[blobPath(index.Manifests[0].Digest)]; !ok {
		t.Fatal("manifest blob missing")
	}
	var manifest struct {
		Config descriptor `json:"config"`
	}
	if err := json.Unmarshal(files[blobPath(index.Manifests[0].Digest)], &manifest); err != nil {
		t.Fatal(err)
	}
	var config struct {
		Config struct{ Labels map[string]string }
	}
	if err := json.Unmarshal(files[blobPath(manifest.Config.Digest)], &config); err != nil {
		t.Fatal(err)
	}
	if config.Config.Labels["org.opencontainers.image.version"] != "v1.2.3" {
		t.Errorf("image config labels %v lack the version", config.Config.Labels)
	}
	first, _ := os.ReadFile(out)
	if err := Write(out, img); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(out)
	if string(first) != string(second) {
		t.Error("archive is not reproducible")
	}
	if err := Write(out, Image{Ref: "ghcr.io/dowse-dev/tool", Binary: bin}); err == nil {
		t.Error("a reference without a tag was accepted")
	}
}
