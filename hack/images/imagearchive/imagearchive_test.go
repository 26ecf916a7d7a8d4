package imagearchive

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestWrite reads the archive back as an OCI layout with
// go-containerregistry's reader: the index names the image the way
// containerd's importer reads it, every digest and size checks out
// (validate.Image), the layer holds the binary at its path as an
// executable, the config has the entrypoint and labels, and writing twice
// gives the same bytes.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!not really a binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "a.tar")
	img := Image{Ref: "ghcr.io/dowse-dev/tool:v1", Binary: bin, Args: []string{"--flag"},
		Labels: map[string]string{"org.opencontainers.image.version": "v1.2.3"}}
	if err := Write(out, img); err != nil {
		t.Fatal(err)
	}
	lp := untar(t, out, filepath.Join(dir, "layout"))
	idx, err := layout.ImageIndexFromPath(lp)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index has %d manifests", len(im.Manifests))
	}
	d := im.Manifests[0]
	if d.Annotations[AnnotationImageName] != img.Ref || d.Annotations[AnnotationRefName] != "v1" {
		t.Errorf("index annotations %v", d.Annotations)
	}
	if string(d.MediaType) != "application/vnd.oci.image.manifest.v1+json" || d.Platform == nil || d.Platform.OS != "linux" {
		t.Errorf("index entry %+v", d)
	}
	v1img, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(v1img); err != nil {
		t.Fatalf("invalid image: %v", err)
	}
	cf, err := v1img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.Labels["org.opencontainers.image.version"] != "v1.2.3" {
		t.Errorf("config labels %v lack the version", cf.Config.Labels)
	}
	if got := cf.Config.Entrypoint; len(got) != 2 || got[0] != "/tool" || got[1] != "--flag" {
		t.Errorf("entrypoint %v", got)
	}
	layers, err := v1img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %v %v", layers, err)
	}
	mt, _ := layers[0].MediaType()
	if string(mt) != "application/vnd.oci.image.layer.v1.tar+gzip" {
		t.Errorf("layer media type %s", mt)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "tool" {
			b, _ := io.ReadAll(tr)
			found = bytes.Equal(b, []byte("#!not really a binary")) && h.Mode&0o111 != 0
		}
	}
	rc.Close()
	if !found {
		t.Error("the layer lacks the executable binary at /tool")
	}

	first, _ := os.ReadFile(out)
	if err := Write(out, img); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(out)
	if !bytes.Equal(first, second) {
		t.Error("archive is not reproducible")
	}
	if err := Write(out, Image{Ref: "tool", Binary: bin}); err == nil {
		t.Error("a reference without registry and tag was accepted")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 { // tool, a.tar, layout
		t.Errorf("Write left temporary files: %v", ents)
	}
}

func untar(t *testing.T, archive, dir string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
