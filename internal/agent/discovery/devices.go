package discovery

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	"google.golang.org/protobuf/proto"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// maxDeviceBytes bounds one device as the handler sent it: its Instance,
// whose JSON may be a few times larger (escapes), must stay within what
// the API server stores of one object (etcd's 1.5 MiB), beside its status.
const maxDeviceBytes = 128 << 10

// permissions is the Instance CRD's pattern of a device node's permissions.
var permissions = regexp.MustCompile(`^[rwm]{0,3}$`)

// screen drops what a handler must not send (empty ids, repeated ids,
// devices whose Instance the API server would refuse, more devices than
// max) and says what it dropped, so a lying handler is reported in the
// Configuration's status instead of corrupting Instances, and one bad
// device does not hold back the others' writes.
func screen(devices []*discoveryv1.Device, max int, allowed HostPaths) (kept []*discoveryv1.Device, problem string) {
	seen := make(map[string]struct{}, len(devices))
	var empty, dup int
	var dupExample string
	var invalid int
	var invalidExamples []string
	for _, d := range devices {
		switch _, ok := seen[d.GetId()]; {
		case d.GetId() == "":
			empty++
		case ok:
			dup++
			if dupExample == "" {
				dupExample = d.GetId()
			}
		case invalidDevice(d) != "" || allowed.refuse(d) != "":
			if invalid++; invalid <= 3 {
				why := invalidDevice(d)
				if why == "" {
					why = allowed.refuse(d)
				}
				invalidExamples = append(invalidExamples, fmt.Sprintf("device %q: %s", cut(d.GetId(), 100), why))
			}
		default:
			seen[d.GetId()] = struct{}{}
			kept = append(kept, d)
		}
	}
	var problems []string
	if empty > 0 {
		problems = append(problems, fmt.Sprintf("%d devices with an empty id", empty))
	}
	if dup > 0 {
		problems = append(problems, fmt.Sprintf("%d repeated device ids (e.g. %q; the first of each was kept)", dup, dupExample))
	}
	if invalid > 0 {
		problems = append(problems, fmt.Sprintf("%d invalid devices (%s)", invalid, strings.Join(invalidExamples, "; ")))
	}
	if max > 0 && len(kept) > max {
		problems = append(problems, fmt.Sprintf("%d devices, more than the agent's limit of %d (the first %d were kept)", len(kept), max, max))
		kept = kept[:max]
	}
	if len(problems) == 0 {
		return kept, ""
	}
	return kept, "handler sent " + strings.Join(problems, ", ")
}

// invalidDevice says what in d its Instance could not hold ("" when
// nothing).
func invalidDevice(d *discoveryv1.Device) string {
	if n := proto.Size(d); n > maxDeviceBytes {
		return fmt.Sprintf("%d bytes, more than %d", n, maxDeviceBytes)
	}
	for i, s := range d.GetDeviceSpecs() {
		if !permissions.MatchString(s.GetPermissions()) {
			return fmt.Sprintf("deviceSpecs[%d].permissions %q is not a combination of r, w and m", i, cut(s.GetPermissions(), 20))
		}
	}
	return ""
}

// HostPaths are the host paths an administrator lets handlers hand out:
// device nodes under Devices, mounts under Mounts (path prefixes, whole
// folder names; "/" allows all). A device naming another is refused, so
// that a handler that lies (or another process on its name) cannot put
// the host's files into the containers that get the device.
type HostPaths struct {
	Devices, Mounts []string
}

// DefaultHostPaths allows device nodes and mounts under /dev (a serial
// port's pty reaches its container as a mount), nothing else: what the
// shipped handlers hand out.
func DefaultHostPaths() HostPaths {
	return HostPaths{Devices: []string{"/dev"}, Mounts: []string{"/dev"}}
}

// refuse says which host path of d is not allowed ("" when none).
func (h HostPaths) refuse(d *discoveryv1.Device) string {
	for i, s := range d.GetDeviceSpecs() {
		if !under(s.GetHostPath(), h.Devices) {
			return fmt.Sprintf("deviceSpecs[%d].hostPath %q is not under the allowed device paths %v (the agent's --allowed-device-paths)", i, cut(s.GetHostPath(), 200), h.Devices)
		}
	}
	for i, m := range d.GetMounts() {
		if !under(m.GetHostPath(), h.Mounts) {
			return fmt.Sprintf("mounts[%d].hostPath %q is not under the allowed mount paths %v (the agent's --allowed-mount-paths)", i, cut(m.GetHostPath(), 200), h.Mounts)
		}
	}
	return ""
}

// under says whether p, an absolute clean path, is one of prefixes or in
// one of their folders.
func under(p string, prefixes []string) bool {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return false
	}
	for _, pre := range prefixes {
		pre = path.Clean(pre)
		if pre == "/" || p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}
