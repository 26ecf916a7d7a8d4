package udev

import (
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
)

// fixture is the fixture machine built by testdata/make-fixture.sh.
var fixture = os.DirFS("testdata/machine")

// fixtureDevices returns every device of a machine tree, as an enumeration
// would.
func fixtureDevices(t *testing.T, fsys fs.FS) []Device {
	t.Helper()
	var devs []Device
	err := fs.WalkDir(fsys, "sys/devices", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if d := NewSysfsDevice(fsys, strings.TrimPrefix(p, "sys")); d != nil {
				devs = append(devs, d)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

const (
	ftdiDevice = "/devices/pci0000:00/0000:00:14.0/usb1/1-1"
	ftdiTTY    = ftdiDevice + "/1-1:1.0/ttyUSB0/tty/ttyUSB0"
	camera     = "/devices/pci0000:00/0000:00:14.0/usb1/1-2"
	video0     = camera + "/1-2:1.0/video4linux/video0"
	video1     = camera + "/1-2:1.0/video4linux/video1"
	null       = "/devices/virtual/mem/null"
	loop0      = "/devices/virtual/block/loop0"
	veth0      = "/devices/virtual/net/veth0"
	tap0       = "/devices/virtual/net/tap0"
)

func TestSysfsDevice(t *testing.T) {
	d := NewSysfsDevice(fixture, ftdiTTY)
	if d == nil {
		t.Fatal("no device")
	}
	if d.Sysname() != "ttyUSB0" || d.Subsystem() != "tty" || d.Driver() != "" || d.Devnode() != "/dev/ttyUSB0" {
		t.Errorf("tty: sysname %q subsystem %q driver %q devnode %q", d.Sysname(), d.Subsystem(), d.Driver(), d.Devnode())
	}
	if got := d.Properties()["ID_SERIAL"]; got != "FTDI_FT232R_USB_UART_A1B2C3" {
		t.Errorf("ID_SERIAL = %q", got)
	}
	var chain []string
	for p := d.Parent(); p != nil; p = p.Parent() {
		chain = append(chain, p.Sysname()+":"+p.Subsystem()+":"+p.Driver())
	}
	want := []string{"ttyUSB0:usb-serial:ftdi_sio", "1-1:1.0:usb:ftdi_sio", "1-1:usb:usb", "usb1:usb:usb", "0000:00:14.0:pci:xhci_hcd", "pci0000:00::"}
	if !slices.Equal(chain, want) {
		t.Errorf("parents = %q, want %q", chain, want)
	}
	if v, ok := d.Parent().Parent().Parent().Attr("serial"); !ok || v != "A1B2C3" {
		t.Errorf("serial = %q, %v; want trailing space trimmed", v, ok)
	}
	if NewSysfsDevice(fixture, "/devices/virtual/mem") != nil {
		t.Error("a directory without uevent is a device")
	}
}

func TestRuleAccepts(t *testing.T) {
	devs := fixtureDevices(t, fixture)
	if len(devs) < 15 {
		t.Fatalf("fixture has %d devices", len(devs))
	}
	for _, tc := range []struct {
		rule string
		want []string
	}{
		{`KERNEL=="null"`, []string{null}},
		{`KERNEL=="null|zero", SUBSYSTEM=="mem"`, []string{null, "/devices/virtual/mem/zero"}},
		{`SUBSYSTEM=="mem", KERNEL!="null"`, []string{"/devices/virtual/mem/zero"}},
		{`SUBSYSTEM=="tty", ATTRS{idVendor}=="0403"`, []string{ftdiTTY}},
		{`SUBSYSTEM=="tty", ATTRS{idVendor}=="0403", ATTRS{idProduct}=="6001", ATTRS{serial}=="A1B2C3"`, []string{ftdiTTY}},
		// Parent keys must hold on one device: bInterfaceNumber and
		// idVendor live on different ones.
		{`SUBSYSTEM=="tty", ATTRS{idVendor}=="0403", ATTRS{bInterfaceNumber}=="00"`, nil},
		{`SUBSYSTEM=="tty", DRIVERS=="ftdi_sio", SUBSYSTEMS=="usb-serial"`, []string{ftdiTTY}},
		{`SUBSYSTEM=="tty", DRIVERS=="ftdi_sio", SUBSYSTEMS=="usb", KERNELS=="1-1:1.0"`, []string{ftdiTTY}},
		{`SUBSYSTEM=="tty", DRIVERS=="uvcvideo"`, nil},
		{`SUBSYSTEM=="video4linux"`, []string{video0, video1}},
		{`SUBSYSTEM=="video4linux", ATTR{index}=="0"`, []string{video0}},
		{`SUBSYSTEM=="video4linux", ENV{ID_V4L_CAPABILITIES}=="*:capture:*"`, []string{video0}},
		{`SUBSYSTEM=="video4linux", ATTR{name}=="HD Webcam*", TAG=="uaccess"`, []string{video0, video1}},
		{`SUBSYSTEM=="video4linux", TAG=="systemd"`, nil},
		{`SUBSYSTEM=="block", ENV{ID_FS_LABEL}=="dowse-data"`, []string{loop0}},
		{`SUBSYSTEM=="block", ENV{ID_FS_LABEL}=="other"`, nil},
		{`ENV{DEVTYPE}=="usb_device", ATTR{idVendor}=="0403"`, []string{ftdiDevice}},
		{`SUBSYSTEM=="net", ATTR{tun_flags}=="?*"`, []string{tap0}},
		// A != on a missing attribute fails, as in udev.
		{`SUBSYSTEM=="net", ATTR{tun_flags}!="0x1002"`, nil},
		{`SUBSYSTEM=="net", ENV{INTERFACE}!="tap*"`, []string{veth0}},
		{`DEVPATH=="/devices/virtual/net/*"`, []string{tap0, veth0}},
		{`DRIVER=="xhci_hcd", ATTR{vendor}=="0x8086"`, []string{"/devices/pci0000:00/0000:00:14.0"}},
		{`SUBSYSTEMS=="pci", KERNEL=="video*"`, []string{video0, video1}},
		{`TAGS=="seat"`, []string{video0, video1}},
	} {
		r, err := ParseRule(0, tc.rule)
		if err != nil {
			t.Fatalf("ParseRule(%q): %v", tc.rule, err)
		}
		var got []string
		for _, d := range devs {
			if r.Accepts(d) {
				got = append(got, d.Devpath())
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s matches %q, want %q", tc.rule, got, tc.want)
		}
	}
}
