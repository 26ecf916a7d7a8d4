// Package cdi writes the CDI spec of each Instance on this node, so that a
// container allocated one of its slots gets the device's env, mounts and
// device nodes (kind dowse.dev/<configuration>, device <hash>).
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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Env is the environment a container using inst gets: each broker property
// as NAME and as NAME_<HASH> (so that a container given several devices of
// one Configuration can tell them apart), names made valid. Properties whose
// name has no valid form (empty) are dropped.
func Env(inst *v1alpha1.Instance) map[string]string {
	hash := EnvName(v1alpha1.InstanceHash(inst.Name))
	env := make(map[string]string, 2*len(inst.Spec.BrokerProperties))
	for _, k := range slices.Sorted(maps.Keys(inst.Spec.BrokerProperties)) {
		name := EnvName(k)
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

// CDISpec is inst's CDI spec: kind dowse.dev/<configuration>, one device
// named after the Instance's hash, with its env, mounts and device nodes.
func Spec(inst *v1alpha1.Instance) (*cdispec.Spec, error) {
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
		Kind:    v1alpha1.CDIKind(inst.Spec.ConfigurationName),
		Devices: []cdispec.Device{{Name: v1alpha1.InstanceHash(inst.Name), ContainerEdits: edits}},
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = v
	return spec, nil
}

// Writer writes and removes Instances' CDI specs in one directory.
type Writer struct {
	dir   string
	cache *cdiapi.Cache
}

// NewWriter makes a Writer for dir (created if missing).
func NewWriter(dir string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// No auto-refresh: the cache is only used to validate and write
	// atomically, never to read specs back.
	c, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache for %s: %w", dir, err)
	}
	return &Writer{dir: dir, cache: c}, nil
}

// SpecFileName is the file inst's spec is written to, without extension:
// namespace and name keep Instances of every namespace apart.
func SpecFileName(inst *v1alpha1.Instance) string {
	return v1alpha1.Domain + "_" + inst.Namespace + "_" + inst.Name
}

// Write validates inst's spec with the CDI library and writes it atomically
// (a temporary file renamed over the old one). Idempotent.
func (w *Writer) Write(inst *v1alpha1.Instance) error {
	spec, err := Spec(inst)
	if err != nil {
		return fmt.Errorf("CDI spec of %s/%s: %w", inst.Namespace, inst.Name, err)
	}
	if err := w.cache.WriteSpec(spec, SpecFileName(inst)+".json"); err != nil {
		return fmt.Errorf("writing CDI spec of %s/%s: %w", inst.Namespace, inst.Name, err)
	}
	return nil
}

// Remove removes the spec of the Instance namespace/name and reports
// whether there was one; a missing spec is no error.
func (w *Writer) Remove(namespace, name string) (bool, error) {
	file := SpecFileName(&v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}) + ".json"
	if _, err := os.Stat(filepath.Join(w.dir, file)); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return true, w.cache.RemoveSpec(file)
}

// Dir is the spec directory.
func (w *Writer) Dir() string { return w.dir }

// EnvName makes s a valid, conventional environment variable name:
// upper case, every character outside [A-Z0-9_] replaced by '_', and a
// leading '_' when it would start with a digit. An empty s gives "".
func EnvName(s string) string {
	if s == "" {
		return ""
	}
	var b strings.Builder
	if s[0] >= '0' && s[0] <= '9' {
		b.WriteByte('_')
	}
	for _, r := range strings.ToUpper(s) {
		switch {
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}
