package modbus

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/goburrow/modbus"
	"github.com/goburrow/serial"
	"golang.org/x/sys/unix"

	"github.com/dowse-dev/dowse/discovery-handlers/udev"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// RTUName is the name Configurations use for Modbus RTU discovery.
const RTUName = "modbus-rtu"

// SkipOverLimit: a serial port past maxPorts, not probed.
const SkipOverLimit = "OverLimit"

// NewRTUDiscoverer returns the Modbus RTU handler.Discoverer. root is the
// machine's file tree whose sys/class/tty and run/udev/data udevRules are
// tested against (nil: the real machine's, os.DirFS("/")); serial ports are
// always opened on the real machine.
func NewRTUDiscoverer(root fs.FS) handler.Discoverer {
	if root == nil {
		root = os.DirFS("/")
	}
	return &rtuDiscoverer{root: root, lines: map[string]chan struct{}{}}
}

// RTUHandler is the Modbus RTU handler as its binary serves it: it probes
// the serial ports of its node, so its devices are the node's own (not
// shared), each handed to its broker as the port's device node.
func RTUHandler() handler.Config {
	return handler.Config{Name: RTUName, Shared: false, Discoverer: NewRTUDiscoverer(nil)}
}

type rtuDiscoverer struct {
	root fs.FS
	// lines are the serial ports' locks, by device node: two
	// Configurations that name one port take turns on it, as a bus
	// carries one request at a time (and its line settings are the
	// port's, not a connection's).
	mu    sync.Mutex
	lines map[string]chan struct{}
}

// line returns the lock of a port's device node: a channel of one, taken
// by sending and given back by receiving.
func (r *rtuDiscoverer) line(node string) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.lines[node]
	if l == nil {
		l = make(chan struct{}, 1)
		r.lines[node] = l
	}
	return l
}

// Discover implements handler.Discoverer: a round probes every port (ports
// at once, each port's units one after another, as a bus carries one
// request at a time), then sleeps rescanInterval.
func (r *rtuDiscoverer) Discover(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
	d, err := ParseRTUDetails(req.GetDiscoveryDetails())
	if err != nil {
		return err
	}
	s := &rtuScanner{d: d, root: r.root, line: r.line, log: logr.FromContextOrDiscard(ctx), known: map[rtuKey]*tracked{}, good: map[string]int{}}
	return handler.Rescan(ctx, d.interval, s.round, s.skippedNow, send)
}

// serialPort is a port to probe: its name as found (a by-id link stays a
// link, so that the broker sees the stable name) and the device node it is.
type serialPort struct {
	name, node string
}

// ports lists the serial ports the details name or select, in name order,
// each device node once; those past MaxPorts come back apart. missing are
// named paths (not patterns) that are not there.
func (d *RTUDetails) ports(root fs.FS) (ports, over []serialPort, missing []string) {
	byNode := map[string]bool{}
	add := func(name string) {
		node, err := filepath.EvalSymlinks(name)
		if err != nil {
			missing = append(missing, name)
			return
		}
		if !byNode[node] {
			byNode[node] = true
			ports = append(ports, serialPort{name: name, node: node})
		}
	}
	var names []string
	for _, p := range d.SerialPorts {
		if !strings.ContainsAny(p, `*?[\`) {
			names = append(names, p)
			continue
		}
		m, _ := filepath.Glob(p) // the pattern was checked in ParseRTUDetails
		names = append(names, m...)
	}
	if len(d.rules) > 0 {
		names = append(names, udevPorts(root, d.rules)...)
	}
	slices.Sort(names)
	for _, n := range slices.Compact(names) {
		add(n)
	}
	if len(ports) > d.MaxPorts {
		return ports[:d.MaxPorts], ports[d.MaxPorts:], missing
	}
	return ports, nil, missing
}

// udevPorts returns the device nodes of the tty devices under root that
// any rule accepts.
func udevPorts(root fs.FS, rules []udev.Rule) []string {
	entries, err := fs.ReadDir(root, "sys/class/tty")
	if err != nil {
		return nil
	}
	var nodes []string
	for _, e := range entries {
		target, err := fs.ReadLink(root, "sys/class/tty/"+e.Name())
		if err != nil {
			continue
		}
		// ../../devices/pnp0/00:04/tty/ttyS0 → /devices/pnp0/00:04/tty/ttyS0
		devpath := path.Clean("/" + strings.TrimLeft(path.Clean("sys/class/"+target), "./"))
		devpath = strings.TrimPrefix(devpath, "/sys")
		dev := udev.NewSysfsDevice(root, devpath)
		if dev == nil || dev.Devnode() == "" {
			continue
		}
		for _, r := range rules {
			if r.Accepts(dev) {
				nodes = append(nodes, dev.Devnode())
				break
			}
		}
	}
	return nodes
}

type rtuKey struct {
	port string
	unit int
}

// rtuScanner is one stream's state between rounds.
type rtuScanner struct {
	d     *RTUDetails
	root  fs.FS
	line  func(node string) chan struct{}
	log   logr.Logger
	known map[rtuKey]*tracked
	// good is the index in d.settings at which a port's units last
	// answered: tried first next round.
	good    map[string]int
	skipped map[string]skipNote
	probed  int
}

// portResult is one round's probe of one port.
type portResult struct {
	port    serialPort
	setting *lineSettings // where units answered; nil when none did
	units   []unitResult
	openErr string
}

func (s *rtuScanner) skippedNow() *handler.Skipped {
	var sk handler.Skipped
	for c, n := range s.skipped {
		sk.Add(n.reason, c, n.msg)
	}
	return &sk
}

// round probes every port and returns the device list.
func (s *rtuScanner) round(ctx context.Context) []*discoveryv1.Device {
	ports, over, missing := s.d.ports(s.root)
	s.probed = len(ports)
	s.skipped = map[string]skipNote{}
	for _, p := range over {
		s.skipped[p.name] = skipNote{SkipOverLimit, fmt.Sprintf("more than maxPorts (%d) serial ports", s.d.MaxPorts)}
	}
	for _, m := range missing {
		s.skipped[m] = skipNote{SkipNoReply, "no such device"}
	}
	results := make([]portResult, len(ports))
	var wg sync.WaitGroup
	for i, p := range ports {
		wg.Go(func() { results[i] = s.probePort(ctx, p) })
	}
	wg.Wait()

	seen := map[rtuKey]bool{}
	for _, r := range results {
		if r.openErr != "" {
			s.skipped[r.port.name] = skipNote{SkipNoReply, r.openErr}
		}
		for _, u := range r.units {
			key := rtuKey{r.port.name, u.unit}
			seen[key] = true
			switch u.outcome {
			case device:
				s.known[key] = &tracked{dev: s.newDevice(r.port, *r.setting, u)}
			case notDevice:
				if _, ok := s.known[key]; ok {
					s.log.Info("modbus rtu device no longer answers the probe or match, dropped", "port", r.port.name, "unitId", u.unit)
					delete(s.known, key)
				}
				s.skipped[fmt.Sprintf("%s unit %d", r.port.name, u.unit)] = skipNote{SkipNoMatch, u.why}
			case noAnswer:
				if _, known := s.known[key]; !known && r.openErr == "" {
					s.skipped[fmt.Sprintf("%s unit %d", r.port.name, u.unit)] = skipNote{SkipNoReply, u.why}
				}
				s.fail(key)
			}
		}
	}
	for key := range s.known {
		if !seen[key] { // its port is gone
			s.fail(key)
		}
	}
	// Two units that claim one identification fall back to their
	// port/unit ids, so that ids stay unique.
	count := map[string]int{}
	for _, t := range s.known {
		count[t.dev.Id]++
	}
	devs := make([]*discoveryv1.Device, 0, len(s.known))
	for key, t := range s.known {
		dev := t.dev
		if count[dev.Id] > 1 {
			dev = &discoveryv1.Device{Id: key.port + "/" + strconv.Itoa(key.unit), Properties: dev.Properties, DeviceSpecs: dev.DeviceSpecs}
		}
		devs = append(devs, dev)
	}
	return devs
}

func (s *rtuScanner) fail(key rtuKey) {
	t, ok := s.known[key]
	if !ok {
		return
	}
	t.failures++
	if t.failures >= s.d.FailureThreshold {
		s.log.Info("modbus rtu device dropped", "port", key.port, "unitId", key.unit, "failedRounds", t.failures)
		delete(s.known, key)
	}
}

// probePort tries the line settings in order, the one that answered last
// round first, and stops at the first at which any unit answers (a
// device, or an exception: a live unit either way), as every unit on one
// bus speaks the bus's settings. A unit that answers nowhere is noAnswer.
func (s *rtuScanner) probePort(ctx context.Context, p serialPort) portResult {
	d := s.d
	res := portResult{port: p}
	l := s.line(p.node)
	select {
	case l <- struct{}{}:
		defer func() { <-l }()
	case <-ctx.Done():
		return res
	}
	order := make([]int, 0, len(d.settings))
	if g, ok := s.good[p.name]; ok && g < len(d.settings) {
		order = append(order, g)
	}
	for i := range d.settings {
		if len(order) == 0 || order[0] != i {
			order = append(order, i)
		}
	}
	// Settings the port refuses (a pseudo-terminal refuses parity) are
	// passed over; only a port that opens at none of them is unreachable.
	var refused []string
	opened := false
	for _, si := range order {
		if ctx.Err() != nil {
			break
		}
		ls := d.settings[si]
		units, answered, err := probeLine(ctx, d, p, ls)
		if err != nil {
			refused = append(refused, fmt.Sprintf("%s: %v", ls, err))
			continue
		}
		opened = true
		if answered {
			s.good[p.name] = si
			res.setting, res.units = &ls, units
			return res
		}
	}
	why := fmt.Sprintf("no answer at %d line settings (%s)", len(d.settings)-len(refused), settingsList(d.settings))
	if len(refused) > 0 {
		why += "; refused by the port: " + strings.Join(refused, ", ")
	}
	if !opened && len(refused) > 0 {
		res.openErr = "opening " + p.name + " failed at every line settings: " + strings.Join(refused, ", ")
		why = res.openErr
	}
	for _, u := range d.units {
		res.units = append(res.units, unitResult{unit: u, outcome: noAnswer, why: why})
	}
	return res
}

func settingsList(ls []lineSettings) string {
	var b strings.Builder
	for i, l := range ls {
		if i > 0 {
			b.WriteString(", ")
		}
		if i == 3 && len(ls) > 4 {
			fmt.Fprintf(&b, "and %d more", len(ls)-3)
			break
		}
		b.WriteString(l.String())
	}
	return b.String()
}

// probeLine opens p with ls and probes every unit; answered is true when
// any unit gave a definite answer.
func probeLine(ctx context.Context, d *RTUDetails, p serialPort, ls lineSettings) (units []unitResult, answered bool, err error) {
	h := modbus.NewRTUClientHandler(p.name)
	h.BaudRate, h.DataBits, h.Parity, h.StopBits = ls.baud, ls.dataBits, ls.parity, ls.stopBits
	h.Timeout = d.timeout
	h.IdleTimeout = 0 // closed below
	if err := h.Connect(); err != nil {
		return nil, false, err
	}
	defer h.Close()
	for _, u := range d.units {
		if ctx.Err() != nil {
			break
		}
		// A unit that answered late, or a partial frame, must not be read
		// as this unit's answer.
		flushInput(p.node)
		r := probeUnit(d.chk, h, func(u byte) { h.SlaveId = u }, u)
		if r.outcome != noAnswer {
			answered = true
		}
		if r.outcome == noAnswer && isSerialTimeout(r.why) {
			r.why = fmt.Sprintf("no answer within %v at %s", d.timeout, ls)
		}
		units = append(units, r.unitResult)
	}
	return units, answered, nil
}

func isSerialTimeout(why string) bool { return why == serial.ErrTimeout.Error() }

// flushInput drops what the line received and nobody read yet.
func flushInput(node string) {
	fd, err := unix.Open(node, unix.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_ = unix.IoctlSetInt(fd, unix.TCFLSH, unix.TCIFLUSH)
	_ = unix.Close(fd)
}

// newDevice builds the device of a unit that answered on port at ls. Its
// id is port/unit (a serial port's by-id name is stable; the agent adds the
// node), or vendor/productCode/serial from the identification.
func (s *rtuScanner) newDevice(p serialPort, ls lineSettings, u unitResult) *discoveryv1.Device {
	props := map[string]string{
		SerialPortProperty: p.name,
		UnitIDProperty:     strconv.Itoa(u.unit),
		BaudRateProperty:   strconv.Itoa(ls.baud),
		DataBitsProperty:   strconv.Itoa(ls.dataBits),
		ParityProperty:     ls.parityName(),
		StopBitsProperty:   strconv.Itoa(ls.stopBits),
	}
	id := identification(&s.d.Probe, u, props)
	if id == "" {
		id = p.name + "/" + strconv.Itoa(u.unit)
	}
	return &discoveryv1.Device{
		Id:          id,
		Properties:  props,
		DeviceSpecs: []*discoveryv1.DeviceSpec{{ContainerPath: p.name, HostPath: p.node, Permissions: "rw"}},
	}
}
