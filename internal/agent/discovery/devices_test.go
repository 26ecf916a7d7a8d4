package discovery

import (
	"fmt"
	"strings"
	"testing"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

func ids(devs []*discoveryv1.Device) string {
	var s []string
	for _, d := range devs {
		s = append(s, d.GetId())
	}
	return strings.Join(s, ",")
}

func TestScreen(t *testing.T) {
	dev := func(id string) *discoveryv1.Device { return &discoveryv1.Device{Id: id} }
	many := make([]*discoveryv1.Device, 12)
	for i := range many {
		many[i] = dev(fmt.Sprint(i))
	}
	cases := []struct {
		name    string
		in      []*discoveryv1.Device
		max     int
		kept    string
		problem []string
	}{
		{"clean", []*discoveryv1.Device{dev("a"), dev("b")}, 10, "a,b", nil},
		{"empty list", nil, 10, "", nil},
		{"empty ids", []*discoveryv1.Device{dev(""), dev("a"), dev("")}, 10, "a", []string{"2 devices with an empty id"}},
		{"duplicates keep first", []*discoveryv1.Device{dev("a"), dev("b"), dev("a"), dev("a")}, 10, "a,b", []string{`2 repeated device ids (e.g. "a"`}},
		{"over the cap", many, 10, "0,1,2,3,4,5,6,7,8,9", []string{"12 devices, more than the agent's limit of 10"}},
		{"no cap", many, 0, "0,1,2,3,4,5,6,7,8,9,10,11", nil},
		// The API server would refuse their Instances: the others are kept.
		{"invalid devices", []*discoveryv1.Device{dev("a"),
			{Id: "tty", DeviceSpecs: []*discoveryv1.DeviceSpec{{HostPath: "/dev/tty0", ContainerPath: "/dev/tty0", Permissions: "rwx"}}},
			{Id: "huge", Properties: map[string]string{"BLOB": strings.Repeat("x", 200<<10)}}, dev("b")}, 10, "a,b",
			[]string{`2 invalid devices (device "tty": deviceSpecs[0].permissions "rwx" is not a combination of r, w and m; device "huge": 204`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			kept, problem := screen(c.in, c.max, HostPaths{Devices: []string{"/"}, Mounts: []string{"/"}})
			if got := ids(kept); got != c.kept {
				t.Fatalf("kept %q, want %q", got, c.kept)
			}
			if len(c.problem) == 0 && problem != "" {
				t.Fatalf("unexpected problem %q", problem)
			}
			for _, p := range c.problem {
				if !strings.Contains(problem, p) {
					t.Fatalf("problem %q does not mention %q", problem, p)
				}
			}
		})
	}
}

// TestHostPathsAllowed: device nodes and mounts only under the allowed
// folders, whole names, absolute and clean; the default allows device
// nodes under /dev and no mount.
func TestHostPathsAllowed(t *testing.T) {
	dev := func(devs []string, mounts []string) *discoveryv1.Device {
		d := &discoveryv1.Device{Id: "x"}
		for _, p := range devs {
			d.DeviceSpecs = append(d.DeviceSpecs, &discoveryv1.DeviceSpec{HostPath: p, ContainerPath: p})
		}
		for _, p := range mounts {
			d.Mounts = append(d.Mounts, &discoveryv1.Mount{HostPath: p, ContainerPath: "/m"})
		}
		return d
	}
	def := DefaultHostPaths()
	for name, c := range map[string]struct {
		d       *discoveryv1.Device
		allowed HostPaths
		ok      bool
	}{
		"video node":         {dev([]string{"/dev/video0"}, nil), def, true},
		"host root mount":    {dev(nil, []string{"/"}), def, false},
		"mount not allowed":  {dev(nil, []string{"/var/lib/cam"}), def, false},
		"mount allowed":      {dev(nil, []string{"/var/lib/cam/a"}), HostPaths{Mounts: []string{"/var/lib/cam"}}, true},
		"prefix is a name":   {dev(nil, []string{"/var/lib/camera"}), HostPaths{Mounts: []string{"/var/lib/cam"}}, false},
		"dot dot":            {dev([]string{"/dev/../etc/shadow"}, nil), def, false},
		"relative":           {dev([]string{"dev/mem"}, nil), def, false},
		"outside /dev":       {dev([]string{"/etc/shadow"}, nil), def, false},
		"everything allowed": {dev([]string{"/etc/shadow"}, []string{"/"}), HostPaths{Devices: []string{"/"}, Mounts: []string{"/"}}, true},
		"no paths at all":    {dev(nil, nil), HostPaths{}, true},
	} {
		if got := c.allowed.refuse(c.d) == ""; got != c.ok {
			t.Errorf("%s: allowed %v, want %v (%s)", name, got, c.ok, c.allowed.refuse(c.d))
		}
	}
	kept, problem := screen([]*discoveryv1.Device{dev([]string{"/dev/ttyUSB0"}, nil), {Id: "root", Mounts: []*discoveryv1.Mount{{HostPath: "/", ContainerPath: "/host"}}}}, 0, def)
	if len(kept) != 1 || kept[0].GetId() != "x" || !strings.Contains(problem, `device "root"`) || !strings.Contains(problem, "--allowed-mount-paths") {
		t.Errorf("screen kept %v, problem %q: want the /dev device alone, the other named with why", kept, problem)
	}
}
