//go:build !linux

package link

import "syscall"

// setNotSentLowat is Linux's alone (TCP_NOTSENT_LOWAT); elsewhere the
// kernel's send queue is as the system sizes it.
func setNotSentLowat(syscall.RawConn, int) {}
