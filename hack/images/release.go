package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/dowse-dev/dowse/hack/images/imagearchive"
)

// release makes one image index per binary name, of the binaries built for
// each platform under bindir/<os>-<arch>/<name>, into the OCI image layout
// out/oci, and lists their references in out/images.txt.
func release(args []string) error {
	fs := flag.NewFlagSet("images release", flag.ContinueOnError)
	out := fs.String("out", "bin/release", "folder of the OCI layout (oci/) and images.txt")
	bindir := fs.String("bindir", "bin/release/bin", "folder with a <os>-<arch> folder of binaries per platform")
	registry := fs.String("registry", "ghcr.io/dowse-dev", "registry and owner part of each image name")
	version := fs.String("version", "", "the release's version: every image's tag and label")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "comma-separated platforms of every image")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version == "" || fs.NArg() == 0 {
		return errors.New("release needs -version and binary names")
	}
	var plats [][2]string
	for _, p := range strings.Split(*platforms, ",") {
		osName, arch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || osName != "linux" {
			return fmt.Errorf("platform %q: want linux/<arch>", p)
		}
		plats = append(plats, [2]string{osName, arch})
	}
	indexes := map[string]v1.ImageIndex{}
	var refs []string
	for _, n := range fs.Args() {
		var imgs []imagearchive.Image
		for _, p := range plats {
			imgs = append(imgs, imagearchive.Image{Binary: filepath.Join(*bindir, p[0]+"-"+p[1], n), Arch: p[1], Labels: imagearchive.Labels(n, *version)})
		}
		idx, err := imagearchive.Index(imgs)
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		ref := fmt.Sprintf("%s/%s:%s", *registry, n, *version)
		indexes[ref] = idx
		refs = append(refs, ref)
	}
	layoutDir := filepath.Join(*out, "oci")
	if err := os.RemoveAll(layoutDir); err != nil {
		return err
	}
	if err := imagearchive.WriteLayout(layoutDir, indexes); err != nil {
		return err
	}
	sort.Strings(refs)
	if err := os.WriteFile(filepath.Join(*out, "images.txt"), []byte(strings.Join(refs, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	for _, r := range refs {
		fmt.Printf("%s (%s)\n", r, *platforms)
	}
	return nil
}

// push copies every image index of an OCI layout (as release writes it) to
// a registry, under the registry given (the names' registry and owner
// replaced).
func push(args []string) error {
	fs := flag.NewFlagSet("images push", flag.ContinueOnError)
	dir := fs.String("layout", "bin/release/oci", "the OCI image layout")
	registry := fs.String("registry", "", "registry and owner to push to, e.g. registry.example.com/dowse-dev")
	insecure := fs.Bool("insecure", false, "plain HTTP (a local registry)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *registry == "" {
		return errors.New("push needs -registry")
	}
	refs, err := Push(*dir, *registry, *insecure)
	for _, r := range refs {
		fmt.Println(r)
	}
	return err
}

// Push pushes the indexes of the layout at dir to registry and returns the
// references pushed.
func Push(dir, registry string, insecure bool) ([]string, error) {
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	root, err := lp.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := root.IndexManifest()
	if err != nil {
		return nil, err
	}
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	var pushed []string
	for _, d := range im.Manifests {
		src, err := name.NewTag(d.Annotations[imagearchive.AnnotationImageName])
		if err != nil {
			return pushed, fmt.Errorf("layout entry %s: %w", d.Digest, err)
		}
		repo := src.RepositoryStr()
		dst, err := name.NewTag(registry+"/"+repo[strings.LastIndex(repo, "/")+1:]+":"+src.TagStr(), opts...)
		if err != nil {
			return pushed, err
		}
		idx, err := root.ImageIndex(d.Digest)
		if err != nil {
			return pushed, err
		}
		if err := remote.WriteIndex(dst, idx); err != nil {
			return pushed, fmt.Errorf("pushing %s: %w", dst, err)
		}
		pushed = append(pushed, dst.String())
	}
	slices.Sort(pushed)
	return pushed, nil
}
