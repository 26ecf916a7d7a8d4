// Package cdi writes the CDI spec of each Instance on this node, so that a
// container allocated one of its slots gets the device's env, mounts and
// device nodes (v1alpha1.CDIName: kind dowse.dev/instance, device
// <instance>.<namespace>).
//
// Containers started before the names carried the namespace asked for
// v1alpha1.LegacyCDIName (kind dowse.dev/<configuration>, device <hash>),
// and the kubelet asks for it again when such a container restarts. A
// Writer made over a directory an earlier agent wrote keeps those names
// defined (an old spec is moved to the Instance's legacy spec file before
// anything is rewritten), and the device plugins and DRA driver keep a
// legacy spec while a pod allocated under the old name may still run
// (KeepLegacy, DropLegacy). The sweeps of both remove the rest.
package cdi

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Env is the environment a container using inst gets: each broker property
// as NAME and as NAME_<HASH> (so that a container given several devices of
// one Configuration can tell them apart), names made valid. Properties whose
// name has no valid form (empty) are dropped.
func Env(inst *v1alpha1.Instance) map[string]string {
	hash := v1alpha1.EnvName(v1alpha1.InstanceHash(inst.Name))
	env := make(map[string]string, 2*len(inst.Spec.BrokerProperties))
	for _, k := range slices.Sorted(maps.Keys(inst.Spec.BrokerProperties)) {
		name := v1alpha1.EnvName(k)
		if name == "" {
			continue
		}
		v := inst.Spec.BrokerProperties[k]
		env[name] = v
		env[name+"_"+hash] = v
	}
	return env
}

// checkPaths refuses what would break a container start later, when the
// runtime applies the edits: relative paths, and device nodes that do not
// exist on this node (the runtime stats them).
func checkPaths(inst *v1alpha1.Instance, stat func(string) (os.FileInfo, error)) error {
	var errs []error
	for _, m := range inst.Spec.Mounts {
		if !filepath.IsAbs(m.HostPath) || !filepath.IsAbs(m.ContainerPath) {
			errs = append(errs, fmt.Errorf("mount %q -> %q: paths must be absolute", m.HostPath, m.ContainerPath))
		}
	}
	for _, d := range inst.Spec.DeviceSpecs {
		if !filepath.IsAbs(d.HostPath) || !filepath.IsAbs(d.ContainerPath) {
			errs = append(errs, fmt.Errorf("device node %q -> %q: paths must be absolute", d.HostPath, d.ContainerPath))
			continue
		}
		if _, err := stat(d.HostPath); err != nil {
			errs = append(errs, fmt.Errorf("device node %q: %w", d.HostPath, err))
		}
	}
	return errors.Join(errs...)
}

// Spec is inst's CDI spec: kind dowse.dev/instance, one device named
// <instance>.<namespace> (v1alpha1.CDIName), with its env, mounts and
// device nodes.
func Spec(inst *v1alpha1.Instance) (*cdispec.Spec, error) {
	return specNamed(inst, inst.CDIName())
}

// LegacySpec is inst's spec under its v1alpha1.LegacyCDIName.
func LegacySpec(inst *v1alpha1.Instance) (*cdispec.Spec, error) {
	return specNamed(inst, inst.LegacyCDIName())
}

// specNamed is inst's spec with the fully qualified device name name.
func specNamed(inst *v1alpha1.Instance, name string) (*cdispec.Spec, error) {
	vendor, class, dev, err := cdiparser.ParseQualifiedName(name)
	if err != nil {
		return nil, fmt.Errorf("CDI device name %q: %w", name, err)
	}
	if err := checkPaths(inst, os.Stat); err != nil {
		return nil, err
	}
	env := Env(inst)
	edits := cdispec.ContainerEdits{}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		edits.Env = append(edits.Env, k+"="+env[k])
	}
	for _, m := range inst.Spec.Mounts {
		opts := []string{"rbind", "rw"}
		if m.ReadOnly {
			opts[1] = "ro"
		}
		edits.Mounts = append(edits.Mounts, &cdispec.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Type: "bind", Options: opts})
	}
	for _, d := range inst.Spec.DeviceSpecs {
		edits.DeviceNodes = append(edits.DeviceNodes, &cdispec.DeviceNode{Path: d.ContainerPath, HostPath: d.HostPath, Permissions: d.Permissions})
	}
	spec := &cdispec.Spec{
		Kind:    vendor + "/" + class,
		Devices: []cdispec.Device{{Name: dev, ContainerEdits: edits}},
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = v
	return spec, nil
}

// Writer writes and removes Instances' CDI specs in one directory. One
// Writer serves the agent's device plugins and DRA driver, so that a
// legacy spec kept by either stays until both let go of it.
type Writer struct {
	dir   string
	cache *cdiapi.Cache
	local *Local

	mu sync.Mutex
	// legacy holds, by Instance, who keeps its legacy spec.
	legacy map[types.NamespacedName]map[string]bool
}

// NewWriter makes a Writer for dir (created if missing). Specs an earlier
// agent wrote under an Instance's legacy name are moved to the Instance's
// legacy spec file first, so that their device stays defined while running
// containers may ask for it; the sweeps remove those no pod needs. Mounts
// and device nodes come from local, this node's own discovery (nil trusts
// the Instance objects).
func NewWriter(dir string, local *Local) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// No auto-refresh: the cache is only used to validate and write
	// atomically, never to read specs back.
	c, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache for %s: %w", dir, err)
	}
	w := &Writer{dir: dir, cache: c, local: local, legacy: map[types.NamespacedName]map[string]bool{}}
	if err := w.keepOldSpecs(); err != nil {
		return nil, err
	}
	return w, nil
}

// keepOldSpecs moves every Instance spec of another kind than
// v1alpha1.CDIKind (an earlier agent's) to the Instance's legacy file: a
// rename, since two files defining one device would make it resolve to
// nothing. Nothing has been handed the new name yet.
func (w *Writer) keepOldSpecs() error {
	for _, f := range w.Specs() {
		if f.Legacy {
			continue
		}
		spec, err := cdiapi.ReadSpec(f.Path, 0)
		if err != nil || spec.Kind == v1alpha1.CDIKind {
			continue // unreadable: nothing a container can use
		}
		if err := os.Rename(f.Path, filepath.Join(w.dir, legacyFileName(f.Instance)+".json")); err != nil {
			return fmt.Errorf("keeping the earlier agent's CDI spec of %s: %w", f.Instance, err)
		}
	}
	return nil
}

func specFileName(key types.NamespacedName) string {
	return v1alpha1.CDISpecFileName(key.Namespace, key.Name)
}

// legacySuffix ends the name of an Instance's legacy spec file.
const legacySuffix = "_legacy"

func legacyFileName(key types.NamespacedName) string { return specFileName(key) + legacySuffix }

// Write validates inst's spec with the CDI library and writes it atomically
// (a temporary file renamed over the old one). Idempotent. A legacy spec
// kept for inst is rewritten with it, so that both stay alike. The mounts
// and device nodes are this node's own (Own).
func (w *Writer) Write(inst *v1alpha1.Instance) error {
	own, err := w.Own(inst)
	if err != nil {
		return fmt.Errorf("CDI spec of %s/%s: %w", inst.Namespace, inst.Name, err)
	}
	inst = own
	spec, err := Spec(inst)
	if err != nil {
		return fmt.Errorf("CDI spec of %s/%s: %w", inst.Namespace, inst.Name, err)
	}
	if err := w.cache.WriteSpec(spec, inst.CDISpecFileName()+".json"); err != nil {
		return fmt.Errorf("writing CDI spec of %s/%s: %w", inst.Namespace, inst.Name, err)
	}
	w.mu.Lock()
	kept := len(w.legacy[client.ObjectKeyFromObject(inst)]) > 0
	w.mu.Unlock()
	if kept {
		return w.writeLegacy(inst)
	}
	return nil
}

// Own is inst as this node hands it to containers: with the mounts and
// device nodes its own handlers reported (Local.Own).
// A nil Writer trusts the object.
func (w *Writer) Own(inst *v1alpha1.Instance) (*v1alpha1.Instance, error) {
	if w == nil {
		return inst, nil
	}
	return w.local.Own(inst)
}

// writeLegacy writes inst's legacy spec; none when the legacy name is not
// a valid CDI name (no earlier agent could have handed it out).
func (w *Writer) writeLegacy(inst *v1alpha1.Instance) error {
	spec, err := LegacySpec(inst)
	if err != nil {
		return nil //nolint:nilerr // an invalid legacy name was never in use
	}
	if err := w.cache.WriteSpec(spec, legacyFileName(client.ObjectKeyFromObject(inst))+".json"); err != nil {
		return fmt.Errorf("writing the legacy CDI spec of %s/%s: %w", inst.Namespace, inst.Name, err)
	}
	return nil
}

// KeepLegacy makes owner keep the legacy spec (v1alpha1.LegacyCDIName) of
// the Instance key and writes it from inst; with inst nil (the Instance is
// not known) it keeps the file an earlier agent left. Idempotent.
func (w *Writer) KeepLegacy(owner string, key types.NamespacedName, inst *v1alpha1.Instance) error {
	w.mu.Lock()
	if w.legacy[key] == nil {
		w.legacy[key] = map[string]bool{}
	}
	w.legacy[key][owner] = true
	w.mu.Unlock()
	if inst == nil {
		return nil
	}
	own, err := w.Own(inst)
	if err != nil {
		return fmt.Errorf("legacy CDI spec of %s/%s: %w", inst.Namespace, inst.Name, err)
	}
	return w.writeLegacy(own)
}

// DropLegacy makes owner let go of key's legacy spec, which is removed
// once nobody keeps it. Idempotent.
func (w *Writer) DropLegacy(owner string, key types.NamespacedName) error {
	w.mu.Lock()
	delete(w.legacy[key], owner)
	keep := len(w.legacy[key]) > 0
	if !keep {
		delete(w.legacy, key)
	}
	w.mu.Unlock()
	if keep {
		return nil
	}
	_, err := w.remove(legacyFileName(key) + ".json")
	return err
}

// LegacyKept says whether anybody keeps key's legacy spec.
func (w *Writer) LegacyKept(key types.NamespacedName) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.legacy[key]) > 0
}

// Remove removes the spec of the Instance namespace/name and reports
// whether there was one; a missing spec is no error. A legacy spec
// somebody keeps stays; one nobody keeps goes too.
func (w *Writer) Remove(namespace, name string) (bool, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	if !w.LegacyKept(key) {
		if _, err := w.remove(legacyFileName(key) + ".json"); err != nil {
			return false, err
		}
	}
	return w.remove(specFileName(key) + ".json")
}

func (w *Writer) remove(file string) (bool, error) {
	if _, err := os.Stat(filepath.Join(w.dir, file)); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return true, w.cache.RemoveSpec(file)
}

// SpecFile is a Dowse spec file in the directory.
type SpecFile struct {
	Path     string
	Instance types.NamespacedName
	// Legacy: the Instance's legacy spec file.
	Legacy bool
}

// Specs lists the Instance spec files in the directory.
func (w *Writer) Specs() []SpecFile {
	files, _ := filepath.Glob(filepath.Join(w.dir, v1alpha1.Domain+"_*_*.json"))
	var out []SpecFile
	for _, f := range files {
		// Namespaces and Instance names never contain '_'.
		parts := strings.Split(strings.TrimSuffix(filepath.Base(f), ".json"), "_")
		legacy := len(parts) == 4 && "_"+parts[3] == legacySuffix
		if len(parts) != 3 && !legacy {
			continue
		}
		out = append(out, SpecFile{Path: f, Instance: types.NamespacedName{Namespace: parts[1], Name: parts[2]}, Legacy: legacy})
	}
	return out
}

// RemoveFile removes a file Specs listed.
func (w *Writer) RemoveFile(f SpecFile) error {
	_, err := w.remove(filepath.Base(f.Path))
	return err
}

// Dir is the spec directory.
func (w *Writer) Dir() string { return w.dir }
