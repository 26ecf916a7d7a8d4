//go:build linux && cgo

package udev

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	goudev "github.com/jochenvg/go-udev"
)

// NewSource returns the Source a handler binary uses: libudev, since this
// binary is built with cgo.
func NewSource() Source { return NewLibudevSource("") }

// libudevSource reads the real machine through libudev.
type libudevSource struct {
	controlSocket string
}

// NewLibudevSource returns the Source that enumerates and monitors the
// machine through libudev. It follows the udev daemon's events when
// controlSocket exists (DefaultControlSocket when empty), else the kernel's
// uevents.
func NewLibudevSource(controlSocket string) Source {
	if controlSocket == "" {
		controlSocket = DefaultControlSocket
	}
	return &libudevSource{controlSocket: controlSocket}
}

// Mode returns what Open would follow now: "udev" or "kernel".
func (s *libudevSource) Mode() string {
	if _, err := os.Stat(s.controlSocket); err != nil {
		return ModeKernel
	}
	return ModeUdev
}

func (s *libudevSource) Open(ctx context.Context) ([]Device, <-chan Event, string, error) {
	// One libudev context per stream: go-udev serialises calls on it.
	u := &goudev.Udev{}
	mode := s.Mode()
	m := u.NewMonitorFromNetlink(mode)
	if m == nil {
		return nil, nil, "", errors.New("cannot open the " + mode + " netlink monitor")
	}
	_ = m.SetReceiveBufferSize(monitorBuffer) // needs privileges; the default is a fallback
	raw, err := m.DeviceChan(ctx)
	if err != nil {
		return nil, nil, "", err
	}
	devs, err := u.NewEnumerate().Devices()
	if err != nil {
		// DeviceChan's goroutine stops when ctx ends; the caller ends it.
		return nil, nil, "", err
	}
	list := make([]Device, 0, len(devs))
	for _, d := range devs {
		list = append(list, libudevDevice{d})
	}
	events := make(chan Event)
	go func() {
		defer close(events)
		for d := range raw {
			ev := Event{Action: d.Action(), Device: libudevDevice{d}, OldDevpath: d.PropertyValue("DEVPATH_OLD")}
			select {
			case events <- ev:
			case <-ctx.Done():
				// go-udev's goroutine blocks on its channel until read;
				// drain it so that it sees ctx and closes it.
				for range raw {
				}
				return
			}
		}
	}()
	return list, events, mode, nil
}

// libudevDevice is a Device read through libudev.
type libudevDevice struct{ d *goudev.Device }

func (l libudevDevice) Devpath() string   { return l.d.Devpath() }
func (l libudevDevice) Sysname() string   { return l.d.Sysname() }
func (l libudevDevice) Subsystem() string { return l.d.Subsystem() }
func (l libudevDevice) Driver() string    { return l.d.Driver() }
func (l libudevDevice) Devnode() string   { return l.d.Devnode() }

func (l libudevDevice) Properties() map[string]string { return l.d.Properties() }

func (l libudevDevice) Tags() []string {
	tags := l.d.Tags()
	out := make([]string, 0, len(tags))
	for t := range tags {
		out = append(out, t)
	}
	return out
}

func (l libudevDevice) Attr(name string) (string, bool) {
	v := l.d.SysattrValue(name)
	if v == "" {
		// libudev answers "" both for an empty and a missing attribute.
		if _, err := os.Stat(filepath.Join(l.d.Syspath(), name)); err != nil {
			return "", false
		}
	}
	return strings.TrimRight(v, " \t\n"), true
}

func (l libudevDevice) Parent() Device {
	p := l.d.Parent()
	if p == nil {
		return nil
	}
	return libudevDevice{p}
}
