package modbus

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"sigs.k8s.io/yaml"
)

func TestParseRTUDetails(t *testing.T) {
	d, err := ParseRTUDetails(`{"serialPorts": ["/dev/ttyUSB0"]}`)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.units, []int{1}) || len(d.settings) != 1 || d.settings[0] != (lineSettings{19200, 8, "E", 1}) ||
		d.timeout != DefaultRTUTimeout || d.interval != DefaultRTURescan || d.MaxPorts != DefaultMaxPorts || d.Probe.Function != HoldingRegisters {
		t.Errorf("defaults: %+v", d)
	}
	d, err = ParseRTUDetails(`{"serialPorts": ["/dev/ttyUSB*"], "baudRates": [9600, 19200], "framings": ["8n2", "7O1"], "unitIds": [5, "1-3", "10-10"]}`)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.units, []int{5, 1, 2, 3, 10}) {
		t.Errorf("units %v", d.units)
	}
	want := []lineSettings{{9600, 8, "N", 2}, {9600, 7, "O", 1}, {19200, 8, "N", 2}, {19200, 7, "O", 1}}
	if !slices.Equal(d.settings, want) {
		t.Errorf("settings %v, want %v", d.settings, want)
	}
	for details, field := range map[string]string{
		`{"serialPorts": ["/dev/x"], "unitIds": ["3-1"]}`:                                   "unitIds[0]",
		`{"serialPorts": ["/dev/x"], "unitIds": [1, "1-2"]}`:                                "unitIds[1]",
		`{"serialPorts": ["/dev/x"], "unitIds": ["a-b"]}`:                                   "range",
		`{"serialPorts": ["/dev/x"], "unitIds": ["1-40"]}`:                                  "maxUnitIds",
		`{"serialPorts": ["/dev/x"], "maxUnitIds": 300}`:                                    "maxUnitIds",
		`{"serialPorts": ["/dev/x"], "baudRates": [9600, 9600]}`:                            "baudRates[1]",
		`{"serialPorts": ["/dev/x"], "framings": ["8E1", "8e1"]}`:                           "framings[1]",
		`{"serialPorts": ["/dev/x"], "timeout": "1m"}`:                                      "timeout",
		`{"serialPorts": ["/dev/["]}`:                                                       "serialPorts[0]",
		`{"serialPorts": ["/dev/x"], "match": {"registers": [{"offset": 1, "equals": 1}]}}`: "match.registers[0].offset",
		`{"serialPorts": ["/dev/x"], "maxPorts": 65}`:                                       "maxPorts",
		`{"serialPorts": ["/dev/x"], "targets": ["10.0.0.1"]}`:                              "targets",
	} {
		if _, err := ParseRTUDetails(details); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want an error naming %s", details, err, field)
		}
	}
}

// TestSampleRTUConfiguration: the sample's discoveryDetails are valid.
func TestSampleRTUConfiguration(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "samples", "modbus-rtu.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Spec struct {
			DiscoveryHandler struct {
				Name             string
				DiscoveryDetails any `json:"discoveryDetails"`
			} `json:"discoveryHandler"`
		}
	}
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	details, _ := yaml.Marshal(c.Spec.DiscoveryHandler.DiscoveryDetails)
	if c.Spec.DiscoveryHandler.Name != RTUName {
		t.Errorf("handler %q", c.Spec.DiscoveryHandler.Name)
	}
	d, err := ParseRTUDetails(string(details))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.settings) != 4 || len(d.units) != 16 || len(d.rules) != 1 {
		t.Errorf("sample details %+v", d)
	}
}

// TestUdevPorts: udevRules select tty devices of a fixture machine by
// their udev properties.
func TestUdevPorts(t *testing.T) {
	link := func(target string) *fstest.MapFile {
		return &fstest.MapFile{Data: []byte(target), Mode: fs.ModeSymlink}
	}
	root := fstest.MapFS{
		"sys/class/tty/ttyUSB0": link("../../devices/pci0000:00/usb1/1-1/1-1:1.0/ttyUSB0/tty/ttyUSB0"),
		"sys/class/tty/ttyS0":   link("../../devices/pnp0/00:04/tty/ttyS0"),
		"sys/devices/pci0000:00/usb1/1-1/1-1:1.0/ttyUSB0/tty/ttyUSB0/uevent":    {Data: []byte("MAJOR=188\nMINOR=0\nDEVNAME=ttyUSB0\n")},
		"sys/devices/pci0000:00/usb1/1-1/1-1:1.0/ttyUSB0/tty/ttyUSB0/subsystem": link("../../../../../../../../class/tty"),
		"sys/devices/pnp0/00:04/tty/ttyS0/uevent":                               {Data: []byte("MAJOR=4\nMINOR=64\nDEVNAME=ttyS0\n")},
		"sys/devices/pnp0/00:04/tty/ttyS0/subsystem":                            link("../../../../class/tty"),
		"run/udev/data/c188:0":                                                  {Data: []byte("E:ID_VENDOR_ID=0403\nE:ID_MODEL_ID=6001\n")},
		"run/udev/data/c4:64":                                                   {Data: []byte("E:ID_PATH=pnp-00:04\n")},
	}
	d, err := ParseRTUDetails(`{"udevRules": ["SUBSYSTEM==\"tty\", ENV{ID_VENDOR_ID}==\"0403\""]}`)
	if err != nil {
		t.Fatal(err)
	}
	if got := udevPorts(root, d.rules); !slices.Equal(got, []string{"/dev/ttyUSB0"}) {
		t.Errorf("udev ports %v, want [/dev/ttyUSB0]", got)
	}
	d, _ = ParseRTUDetails(`{"udevRules": ["SUBSYSTEM==\"tty\", KERNEL==\"ttyS*\""]}`)
	if got := udevPorts(root, d.rules); !slices.Equal(got, []string{"/dev/ttyS0"}) {
		t.Errorf("udev ports %v, want [/dev/ttyS0]", got)
	}
}
