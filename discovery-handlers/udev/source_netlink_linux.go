//go:build linux

package udev

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Netlink multicast groups of NETLINK_KOBJECT_UEVENT.
const (
	groupKernel = 1
	groupUdev   = 2
)

// udevMagic marks a udev daemon's monitor message (libudev's
// UDEV_MONITOR_MAGIC), in network byte order after the "libudev\0" prefix.
const udevMagic = 0xfeedcafe

// netlinkSource reads the machine without libudev: it enumerates the
// devices of a sysfs tree read through an fs.FS (NewSysfsDevice) and follows
// the uevent netlink socket itself. It is what a binary built without cgo
// uses, so that a static image works.
type netlinkSource struct {
	root          fs.FS
	controlSocket string
}

// NewNetlinkSource returns the pure-Go Source: devices enumerated from root
// (os.DirFS("/") when nil: sys/devices and the udev database under
// run/udev/data), events from the netlink uevent socket, the udev daemon's
// when controlSocket (DefaultControlSocket when empty) exists, else the
// kernel's.
func NewNetlinkSource(root fs.FS, controlSocket string) Source {
	if root == nil {
		root = os.DirFS("/")
	}
	if controlSocket == "" {
		controlSocket = DefaultControlSocket
	}
	return &netlinkSource{root: root, controlSocket: controlSocket}
}

// Mode returns what Open would follow now: "udev" or "kernel".
func (s *netlinkSource) Mode() string {
	if _, err := os.Stat(s.controlSocket); err != nil {
		return ModeKernel
	}
	return ModeUdev
}

func (s *netlinkSource) Open(ctx context.Context) ([]Device, <-chan Event, string, error) {
	mode := s.Mode()
	group := uint32(groupKernel)
	if mode == ModeUdev {
		group = groupUdev
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, nil, "", fmt.Errorf("uevent socket: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, monitorBuffer) // needs CAP_NET_ADMIN
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(fd)
		return nil, nil, "", fmt.Errorf("uevent socket: SO_PASSCRED: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: group}); err != nil {
		unix.Close(fd)
		return nil, nil, "", fmt.Errorf("uevent socket: bind to the %s group: %w", mode, err)
	}
	// The runtime poller makes reads wait without a thread, and closing
	// the file ends a read in progress.
	f := os.NewFile(uintptr(fd), "uevent")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, "", err
	}
	devs, err := enumerateSysfs(s.root)
	if err != nil {
		f.Close()
		return nil, nil, "", err
	}
	events := make(chan Event)
	stop := context.AfterFunc(ctx, func() { f.Close() })
	go func() {
		defer close(events)
		defer stop()
		defer f.Close()
		buf := make([]byte, 64<<10)
		oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
		for {
			var n, oobn int
			var from unix.Sockaddr
			var rerr error
			err := raw.Read(func(fd uintptr) bool {
				n, oobn, _, from, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
				return rerr != unix.EAGAIN
			})
			if err == nil {
				err = rerr
			}
			if err != nil {
				if errors.Is(err, unix.ENOBUFS) {
					// Events were lost; nothing tells which. The stream
					// stays up and later events correct the list.
					continue
				}
				return
			}
			if !trustedSender(from, oob[:oobn], group) {
				continue
			}
			ev, ok := parseUevent(buf[:n], group, s.root)
			if !ok {
				continue
			}
			select {
			case events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return devs, events, mode, nil
}

// trustedSender accepts, as libudev does, only messages sent by root, and
// on the kernel group only those sent by the kernel itself.
func trustedSender(from unix.Sockaddr, oob []byte, group uint32) bool {
	nl, ok := from.(*unix.SockaddrNetlink)
	if !ok {
		return false
	}
	if group == groupKernel && nl.Pid != 0 {
		return false
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return false
	}
	for _, m := range msgs {
		if cred, err := unix.ParseUnixCredentials(&m); err == nil {
			return cred.Uid == 0
		}
	}
	return false
}

// parseUevent decodes a kernel uevent ("action@devpath\0KEY=VALUE\0...")
// or a udev daemon's message (libudev's header, then KEY=VALUE\0...).
func parseUevent(msg []byte, group uint32, root fs.FS) (Event, bool) {
	var props []byte
	if group == groupUdev {
		// struct udev_monitor_netlink_header: prefix[8], magic, header_size,
		// properties_off, properties_len, filter fields (all uint32).
		if len(msg) < 24 || !bytes.HasPrefix(msg, []byte("libudev\x00")) || binary.BigEndian.Uint32(msg[8:]) != udevMagic {
			return Event{}, false
		}
		off := binary.NativeEndian.Uint32(msg[16:])
		size := binary.NativeEndian.Uint32(msg[20:])
		if uint64(off)+uint64(size) > uint64(len(msg)) {
			return Event{}, false
		}
		props = msg[off : off+size]
	} else {
		head, rest, ok := bytes.Cut(msg, []byte{0})
		if !ok || !bytes.Contains(head, []byte("@/")) {
			return Event{}, false
		}
		props = rest
	}
	p := map[string]string{}
	for _, kv := range bytes.Split(props, []byte{0}) {
		if k, v, ok := bytes.Cut(kv, []byte("=")); ok {
			p[string(k)] = string(v)
		}
	}
	devpath, action := p["DEVPATH"], p["ACTION"]
	if devpath == "" || action == "" {
		return Event{}, false
	}
	d := &eventDevice{root: root, devpath: devpath, props: p}
	if name := p["DEVNAME"]; name != "" {
		d.devnode = name
		if !strings.HasPrefix(name, "/") {
			d.devnode = path.Join("/dev", name)
		}
	}
	for _, t := range strings.Split(p["TAGS"], ":") {
		if t != "" {
			d.tags = append(d.tags, t)
		}
	}
	return Event{Action: action, Device: d, OldDevpath: p["DEVPATH_OLD"]}, true
}

// eventDevice is the device of an event: its identity and properties come
// from the event, its attributes and parents from sysfs.
type eventDevice struct {
	root    fs.FS
	devpath string
	devnode string
	props   map[string]string
	tags    []string
}

func (d *eventDevice) Devpath() string               { return d.devpath }
func (d *eventDevice) Sysname() string               { return path.Base(d.devpath) }
func (d *eventDevice) Subsystem() string             { return d.props["SUBSYSTEM"] }
func (d *eventDevice) Driver() string                { return d.props["DRIVER"] }
func (d *eventDevice) Devnode() string               { return d.devnode }
func (d *eventDevice) Properties() map[string]string { return d.props }
func (d *eventDevice) Tags() []string                { return d.tags }

func (d *eventDevice) Attr(name string) (string, bool) {
	v, err := fs.ReadFile(d.root, "sys"+d.devpath+"/"+name)
	if err != nil {
		return "", false
	}
	return strings.TrimRight(string(v), " \t\n"), true
}

func (d *eventDevice) Parent() Device {
	for p := path.Dir(d.devpath); p != "/" && p != "/devices"; p = path.Dir(p) {
		if dev := NewSysfsDevice(d.root, p); dev != nil {
			return dev
		}
	}
	return nil
}

// enumerateSysfs returns every device under sys/devices of root. Symlinks
// are not followed, so each device is seen once.
func enumerateSysfs(root fs.FS) ([]Device, error) {
	var devs []Device
	err := fs.WalkDir(root, "sys/devices", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if p == "sys/devices" {
				return err
			}
			return fs.SkipDir // an unreadable directory holds no device we can read
		}
		if !e.IsDir() {
			return nil
		}
		if d := NewSysfsDevice(root, strings.TrimPrefix(p, "sys")); d != nil {
			devs = append(devs, d)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("enumerating devices: %w", err)
	}
	return devs, nil
}
