package link

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// setNotSentLowat keeps at most about n bytes written and not yet sent in
// the socket's kernel queue (TCP_NOTSENT_LOWAT): a write waits for them to
// go instead, so what is sent next is the link's writer's choice (twins
// before stream data), not the order of an earlier write that queued
// megabytes. Best effort: an error leaves the socket as it was.
func setNotSentLowat(rc syscall.RawConn, n int) {
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, n)
	})
}
