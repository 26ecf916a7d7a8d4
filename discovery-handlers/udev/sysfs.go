package udev

import (
	"bufio"
	"bytes"
	"io/fs"
	"path"
	"strings"
)

// NewSysfsDevice returns the device at devpath (such as
// /devices/virtual/mem/null) read from fsys, a tree laid out like the root
// of a Linux machine: sys/<devpath> as sysfs shows it (uevent file,
// subsystem and driver symlinks, attribute files) and run/udev/data/<id> as
// the udev daemon's database. It returns nil when devpath is no device
// (has no uevent file). os.DirFS("/") reads the real machine; fixture trees
// under testdata read the same way. fsys must implement fs.ReadLinkFS for
// the subsystem and driver to be known.
func NewSysfsDevice(fsys fs.FS, devpath string) Device {
	devpath = path.Clean("/" + devpath)
	d := &sysfsDevice{fsys: fsys, devpath: devpath, dir: "sys" + devpath}
	uevent, err := fs.ReadFile(fsys, d.dir+"/uevent")
	if err != nil {
		return nil
	}
	d.props = map[string]string{}
	for _, line := range strings.Split(string(uevent), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			d.props[k] = v
		}
	}
	d.subsystem = d.link("subsystem")
	d.driver = d.link("driver")
	d.props["DEVPATH"] = devpath
	if d.subsystem != "" {
		d.props["SUBSYSTEM"] = d.subsystem
	}
	if name := d.props["DEVNAME"]; name != "" {
		d.devnode = path.Join("/dev", name)
	}
	d.readDatabase()
	return d
}

type sysfsDevice struct {
	fsys                       fs.FS
	devpath, dir               string
	subsystem, driver, devnode string
	props                      map[string]string
	tags                       []string
}

func (d *sysfsDevice) link(name string) string {
	target, err := fs.ReadLink(d.fsys, d.dir+"/"+name)
	if err != nil {
		return ""
	}
	return path.Base(target)
}

// dbID is the device's name in the udev database, as libudev forms it.
func (d *sysfsDevice) dbID() string {
	if maj, min := d.props["MAJOR"], d.props["MINOR"]; maj != "" && min != "" {
		if d.subsystem == "block" {
			return "b" + maj + ":" + min
		}
		return "c" + maj + ":" + min
	}
	if i := d.props["IFINDEX"]; i != "" {
		return "n" + i
	}
	return "+" + d.subsystem + ":" + d.Sysname()
}

func (d *sysfsDevice) readDatabase() {
	data, err := fs.ReadFile(d.fsys, "run/udev/data/"+d.dbID())
	if err != nil {
		return
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "E:"):
			if k, v, ok := strings.Cut(line[2:], "="); ok {
				d.props[k] = v
			}
		case strings.HasPrefix(line, "G:"):
			d.tags = append(d.tags, line[2:])
		}
	}
}

func (d *sysfsDevice) Devpath() string               { return d.devpath }
func (d *sysfsDevice) Sysname() string               { return path.Base(d.devpath) }
func (d *sysfsDevice) Subsystem() string             { return d.subsystem }
func (d *sysfsDevice) Driver() string                { return d.driver }
func (d *sysfsDevice) Devnode() string               { return d.devnode }
func (d *sysfsDevice) Properties() map[string]string { return d.props }
func (d *sysfsDevice) Tags() []string                { return d.tags }

func (d *sysfsDevice) Attr(name string) (string, bool) {
	v, err := fs.ReadFile(d.fsys, d.dir+"/"+name)
	if err != nil {
		return "", false
	}
	return strings.TrimRight(string(v), " \t\n"), true
}

func (d *sysfsDevice) Parent() Device {
	for p := path.Dir(d.devpath); p != "/" && p != "/devices"; p = path.Dir(p) {
		if dev := NewSysfsDevice(d.fsys, p); dev != nil {
			return dev
		}
	}
	return nil
}
