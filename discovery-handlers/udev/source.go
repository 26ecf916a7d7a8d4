package udev

// DefaultControlSocket is the udev daemon's control socket: when it exists a
// daemon runs, and its monitor carries the events it has processed (with
// the udev properties it added); otherwise only the kernel's uevents come.
const DefaultControlSocket = "/run/udev/control"

// monitorBuffer is the receive buffer asked for a monitor socket, so that a
// burst of events (a hub with many devices) is not dropped.
const monitorBuffer = 8 << 20

// Source modes, what a Source follows.
const (
	ModeUdev   = "udev"
	ModeKernel = "kernel"
)
