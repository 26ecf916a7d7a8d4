// Command images turns static binaries into OCI images with
// go-containerregistry (package imagearchive):
//
//	go run ./hack/images -out bin/images -tag latest bin/static/dowse-agent ...
//
// writes one archive bin/images/<name>.tar per binary (this machine's
// architecture, named <registry>/<name>:<tag> as deploy/ names them), for
// the test node and the demo;
//
//	go run ./hack/images release -version V -bindir bin/release/bin dowse-agent ...
//
// makes one image index per binary of every platform (make release) into
// an OCI image layout with images.txt; and
//
//	go run ./hack/images push -layout bin/release/oci -registry R
//
// pushes that layout's indexes to registry R.
package main

import (
	"debug/elf"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/dowse-dev/dowse/hack/images/imagearchive"
)

type config struct {
	out      string
	registry string
	tag      string
	version  string
	binaries []string
}

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "release" || os.Args[1] == "push") {
		run := release
		if os.Args[1] == "push" {
			run = push
		}
		if err := run(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "images %s: %v\n", os.Args[1], err)
			os.Exit(1)
		}
		return
	}
	var cfg config
	flag.StringVar(&cfg.out, "out", "bin/images", "folder the archives are written to")
	flag.StringVar(&cfg.registry, "registry", "ghcr.io/dowse-dev", "registry and owner part of each image name")
	flag.StringVar(&cfg.tag, "tag", "latest", "tag of every image")
	flag.StringVar(&cfg.version, "version", "dev", "version the binaries were stamped with (--version), in each image's labels")
	flag.Parse()
	cfg.binaries = flag.Args()
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(cfg config) error {
	if len(cfg.binaries) == 0 {
		return fmt.Errorf("no binaries given")
	}
	for _, b := range cfg.binaries {
		if err := checkStatic(b); err != nil {
			return err
		}
		name := filepath.Base(b)
		ref := fmt.Sprintf("%s/%s:%s", cfg.registry, name, cfg.tag)
		out := filepath.Join(cfg.out, name+".tar")
		if err := imagearchive.Write(out, imagearchive.Image{Ref: ref, Binary: b, Labels: imagearchive.Labels(name, cfg.version)}); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Printf("%s -> %s\n", ref, out)
	}
	return nil
}

// checkStatic refuses a dynamically linked binary: the image holds nothing but
// the binary, so it would fail only when the pod starts, far from the cause.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}
