package imagearchive

import (
	"debug/elf"
	"fmt"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Index builds one image per platform of the same program (imgs differ in
// Binary and Arch) and returns them as one OCI image index, each manifest
// with its platform, so that a node pulls the one of its architecture.
func Index(imgs []Image) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, img := range imgs {
		if img.Path == "" {
			img.Path = "/" + filepath.Base(img.Binary)
		}
		if len(img.Env) == 0 {
			img.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/"}
		}
		if err := CheckELF(img.Binary, img.Arch); err != nil {
			return nil, err
		}
		v1img, err := build(img)
		if err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: v1img,
			Descriptor: v1.Descriptor{MediaType: types.OCIManifestSchema1, Platform: &v1.Platform{OS: "linux", Architecture: img.Arch}}})
	}
	return idx, nil
}

// WriteLayout writes indexes to an OCI image layout at dir (created, or
// appended to), each annotated with its reference (ref.name the tag, and
// the full name as containerd's importer reads it).
func WriteLayout(dir string, indexes map[string]v1.ImageIndex) error {
	lp, err := layout.FromPath(dir)
	if err != nil {
		if lp, err = layout.Write(dir, empty.Index); err != nil {
			return err
		}
	}
	for ref, idx := range indexes {
		tag, err := name.NewTag(ref, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("image reference %q: %w", ref, err)
		}
		if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{AnnotationImageName: tag.String(), AnnotationRefName: tag.TagStr()})); err != nil {
			return err
		}
	}
	return nil
}

// machines are the ELF machines of the GOARCHes a release builds.
var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "arm": elf.EM_ARM, "riscv64": elf.EM_RISCV, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390}

// CheckELF fails unless path is a static ELF executable for arch (a GOARCH):
// an image holds nothing but the binary, so a dynamic or foreign one would
// fail only when a node starts it.
func CheckELF(path, arch string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	want, ok := machines[arch]
	if !ok {
		return fmt.Errorf("%s: architecture %q unknown", path, arch)
	}
	if f.Machine != want {
		return fmt.Errorf("%s is an ELF binary for %s, not %s (%s)", path, f.Machine, arch, want)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}
