package udev

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
)

func mustDetails(t *testing.T, s string) *Details {
	t.Helper()
	d, err := ParseDetails(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestTrackerList(t *testing.T) {
	tr := newTracker(mustDetails(t, `{"udevRules": ["SUBSYSTEM==\"tty\", ATTRS{idVendor}==\"0403\", ENV{ID_PATH}==\"?*\""], "permissions": "rw"}`))
	for _, d := range fixtureDevices(t, fixture) {
		tr.evaluate(d)
	}
	devs := tr.list()
	if len(devs) != 1 {
		t.Fatalf("got %d devices", len(devs))
	}
	d := devs[0]
	wantProps := map[string]string{
		DevpathProperty:   ftdiTTY,
		DevnodeProperty:   "/dev/ttyUSB0",
		SubsystemProperty: "tty",
		"ID_VENDOR_ID":    "0403",
		"ID_MODEL_ID":     "6001",
		"ID_SERIAL":       "FTDI_FT232R_USB_UART_A1B2C3",
		"ID_PATH":         "pci-0000:00:14.0-usb-0:1:1.0", // named by ENV{} and an identity property
	}
	if d.Id != ftdiTTY || !maps.Equal(d.Properties, wantProps) {
		t.Errorf("device = %v, want id %s, properties %v", d, ftdiTTY, wantProps)
	}
	if len(d.DeviceSpecs) != 1 || d.DeviceSpecs[0].HostPath != "/dev/ttyUSB0" || d.DeviceSpecs[0].ContainerPath != "/dev/ttyUSB0" || d.DeviceSpecs[0].Permissions != "rw" {
		t.Errorf("device specs = %v", d.DeviceSpecs)
	}
}

func TestTrackerGroupRecursive(t *testing.T) {
	rules := `["ATTRS{idVendor}==\"046d\""]`
	for _, tc := range []struct {
		group     bool
		ids       []string
		devnodes0 []string
	}{
		{false, []string{camera, camera + "/1-2:1.0", video0, video1}, []string{"/dev/bus/usb/001/003"}},
		{true, []string{camera}, []string{"/dev/bus/usb/001/003", "/dev/video0", "/dev/video1"}},
	} {
		tr := newTracker(mustDetails(t, `{"udevRules": `+rules+`, "groupRecursive": `+map[bool]string{true: "true", false: "false"}[tc.group]+`}`))
		for _, d := range fixtureDevices(t, fixture) {
			tr.evaluate(d)
		}
		devs := tr.list()
		if got := handlertest.IDs(devs); !slices.Equal(got, tc.ids) {
			t.Fatalf("groupRecursive %v: ids %q, want %q", tc.group, got, tc.ids)
		}
		var nodes []string
		for _, s := range devs[0].DeviceSpecs {
			nodes = append(nodes, s.HostPath)
		}
		if !slices.Equal(nodes, tc.devnodes0) || devs[0].Properties[DevnodeProperty] != "/dev/bus/usb/001/003" {
			t.Errorf("groupRecursive %v: device specs %q, properties %v; want %q", tc.group, nodes, devs[0].Properties, tc.devnodes0)
		}
	}
}

// fakeSource serves a fixed enumeration and the events a test pushes.
type fakeSource struct {
	devices []Device
	events  chan Event
}

func (f *fakeSource) Open(ctx context.Context) ([]Device, <-chan Event, string, error) {
	return f.devices, f.events, "fake", nil
}

// fakeDevice is a device whose values a test sets.
type fakeDevice struct {
	devpath, subsystem, devnode string
	props                       map[string]string
}

func (f fakeDevice) Devpath() string               { return f.devpath }
func (f fakeDevice) Sysname() string               { return sysname(f.devpath) }
func (f fakeDevice) Subsystem() string             { return f.subsystem }
func (f fakeDevice) Driver() string                { return "" }
func (f fakeDevice) Devnode() string               { return f.devnode }
func (f fakeDevice) Properties() map[string]string { return f.props }
func (f fakeDevice) Tags() []string                { return nil }
func (f fakeDevice) Attr(string) (string, bool)    { return "", false }
func (f fakeDevice) Parent() Device                { return nil }

// TestDiscoverEvents runs the handler over a fake source and checks that
// each change of the matched set reaches the Discover stream, and that
// events that change nothing send nothing.
func TestDiscoverEvents(t *testing.T) {
	src := &fakeSource{devices: fixtureDevices(t, fixture), events: make(chan Event)}
	reg := runHandler(t, src)

	bad := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: `udevRules: ['KERNEL=="ttyUSB[0-9"']`})
	if err := bad.Err(t, 5*time.Second); status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad rule: %v, want InvalidArgument", err)
	}

	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: `udevRules: ['SUBSYSTEM=="net", KERNEL=="veth*|dw*"', 'KERNEL=="loop*", ENV{ID_FS_LABEL}=="dowse-*"']`})
	wait := 5 * time.Second
	if got := handlertest.IDs(s.Next(t, wait)); !slices.Equal(got, []string{loop0, veth0}) {
		t.Fatalf("first list %q", got)
	}
	dw := fakeDevice{devpath: "/devices/virtual/net/dw1", subsystem: "net", props: map[string]string{"INTERFACE": "dw1"}}
	src.events <- Event{Action: ActionAdd, Device: dw}
	if got := handlertest.IDs(s.Next(t, wait)); !slices.Equal(got, []string{loop0, dw.devpath, veth0}) {
		t.Fatalf("after add %q", got)
	}
	// A change that alters no property, and a device that matches no rule,
	// send nothing; the label going away drops the loop device.
	src.events <- Event{Action: ActionChange, Device: dw}
	src.events <- Event{Action: ActionAdd, Device: fakeDevice{devpath: "/devices/virtual/net/eth9", subsystem: "net"}}
	src.events <- Event{Action: ActionChange, Device: fakeDevice{devpath: loop0, subsystem: "block", devnode: "/dev/loop0", props: map[string]string{}}}
	if got := handlertest.IDs(s.Next(t, wait)); !slices.Equal(got, []string{dw.devpath, veth0}) {
		t.Fatalf("after label removed %q", got)
	}
	// A move renames; a remove of a parent removes what is below it.
	src.events <- Event{Action: ActionMove, Device: fakeDevice{devpath: "/devices/virtual/net/dw2", subsystem: "net"}, OldDevpath: dw.devpath}
	if got := handlertest.IDs(s.Next(t, wait)); !slices.Equal(got, []string{"/devices/virtual/net/dw2", veth0}) {
		t.Fatalf("after move %q", got)
	}
	src.events <- Event{Action: ActionRemove, Device: fakeDevice{devpath: "/devices/virtual/net"}}
	if got := s.Next(t, wait); len(got) != 0 {
		t.Fatalf("after remove %q", handlertest.IDs(got))
	}
}

// runHandler runs the handler over src with a fake agent until the test
// ends, and returns its registration.
func runHandler(t *testing.T, src Source) *discoveryv1.RegisterDiscoveryHandlerRequest {
	t.Helper()
	cfg := Handler()
	cfg.Discoverer, cfg.Logger = NewDiscoverer(src), testr.New(t)
	reg := handlertest.Run(t, cfg)
	if reg.GetShared() {
		t.Error("udev handler registered as shared")
	}
	return reg
}
