// Package nullmodem links two pseudo-terminals as a null-modem cable links
// two serial ports (what socat's pty,link does), for tests that need a
// serial line: what is written to one end comes out of the other. OpenLine
// makes a pair that is also strict about line settings, as a real line is.
package nullmodem

import (
	"context"
	"errors"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Open makes the pair and returns the device paths of its two ends
// (/dev/pts/N); the relay between them stops when the test ends. A machine
// without pseudo-terminals fails the test under CI=true and skips it
// otherwise.
func Open(t testing.TB) (string, string) {
	t.Helper()
	return open(t, false)
}

// OpenLine is Open for a pair that carries bytes, as a real line does,
// only while both ends use the same line settings: speed, data bits,
// parity and stop bits, as each end's program set them (termios). What an
// end sends while the other listens at another speed or framing is lost,
// as a UART that sees only framing errors drops it, so that a test can tell
// a device found at its own baud rate from one "found" at any.
func OpenLine(t testing.TB) (string, string) {
	t.Helper()
	return open(t, true)
}

// lineBits are the termios control flags a line's two ends must agree on.
const lineBits = unix.CBAUD | unix.CBAUDEX | unix.CSIZE | unix.PARENB | unix.PARODD | unix.CSTOPB

// lineOf is an end's line settings. A pseudo-terminal master's TCGETS
// reads its slave's termios, which the program on that end set.
func lineOf(f *os.File) (uint32, bool) {
	tio, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		return 0, false
	}
	return tio.Cflag & lineBits, true
}

func open(t testing.TB, strict bool) (string, string) {
	t.Helper()
	open := func() (*os.File, string) {
		fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("no pseudo-terminals (/dev/ptmx): %v", err)
			}
			t.Skipf("no pseudo-terminals (/dev/ptmx): %v", err)
		}
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			t.Fatal(err)
		}
		n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
		if err != nil {
			t.Fatal(err)
		}
		// Non-blocking, so that the runtime polls it and Close ends a
		// Read in progress: a master whose slave was never opened blocks
		// a plain read for ever.
		if err := unix.SetNonblock(fd, true); err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(fd), "ptmx"), "/dev/pts/" + strconv.Itoa(n)
	}
	a, pathA := open()
	b, pathB := open()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	relay := func(from, to *os.File) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 512)
		for ctx.Err() == nil {
			n, err := from.Read(buf)
			if n > 0 && (!strict || sameLine(from, to)) {
				_, _ = to.Write(buf[:n])
			}
			if err != nil {
				// EIO while no process has this end open (between a
				// client's close and the next open): wait for one.
				if !errors.Is(err, syscall.EIO) {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	go relay(a, b)
	go relay(b, a)
	t.Cleanup(func() {
		cancel()
		a.Close()
		b.Close()
		<-done
		<-done
	})
	return pathA, pathB
}

// sameLine says whether both ends use the same line settings.
func sameLine(a, b *os.File) bool {
	la, okA := lineOf(a)
	lb, okB := lineOf(b)
	return okA && okB && la == lb
}
