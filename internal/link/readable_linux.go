package link

import (
	"errors"
	"syscall"
)

// socketReadable reports whether the socket fd has data (or an end or an
// error, which the next read reports) without taking any: a RawConn.Read
// function, false meaning "wait for it".
func socketReadable(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return !errors.Is(err, syscall.EAGAIN)
}
