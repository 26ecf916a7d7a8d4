package nullmodem_test

import (
	"io"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dowse-dev/dowse/test/peers/nullmodem"
)

// raw opens a pair's end in raw mode, as a serial library does (no echo,
// no line editing).
func raw(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tio, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	tio.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	tio.Oflag &^= unix.OPOST
	tio.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	tio.Cflag = tio.Cflag&^(unix.CSIZE|unix.PARENB) | unix.CS8
	tio.Cc[unix.VMIN], tio.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(int(f.Fd()), unix.TCSETS, tio); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestPair: what is written to one end comes out of the other, both ways;
// and a pair stops at the test's end even while a process still holds an
// end open (its relay's read of that end once blocked for ever, and the
// cleanup with it).
func TestPair(t *testing.T) {
	t.Run("EndHeldOpen", func(t *testing.T) {
		var held *os.File
		t.Cleanup(func() { held.Close() }) // after the pair's own cleanup
		a, _ := nullmodem.Open(t)
		var err error
		if held, err = os.OpenFile(a, os.O_RDWR|unix.O_NOCTTY, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // the relay is reading by now
	})
	a, b := nullmodem.Open(t)
	fa, fb := raw(t, a), raw(t, b)
	for _, dir := range [][2]*os.File{{fa, fb}, {fb, fa}} {
		msg := []byte{0x07, 0x03, 0x00, 0x00, 0x00, 0x01, 0x84, 0x6c, '\n', 0xff}
		if _, err := dir[0].Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(dir[1], got); err != nil {
			t.Fatal(err)
		}
		if string(got) != string(msg) {
			t.Fatalf("sent % x, received % x", msg, got)
		}
	}
}

// setSpeed sets an end's speed (and keeps its framing).
func setSpeed(t *testing.T, f *os.File, speed uint32) {
	t.Helper()
	tio, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	tio.Cflag = tio.Cflag&^(unix.CBAUD|unix.CBAUDEX) | speed
	tio.Ispeed, tio.Ospeed = 0, 0
	if err := unix.IoctlSetTermios(int(f.Fd()), unix.TCSETS, tio); err != nil {
		t.Fatal(err)
	}
}

// readable says whether f has bytes to read within d.
func readable(t *testing.T, f *os.File, d time.Duration) bool {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, int(d.Milliseconds()))
	if err != nil && err != unix.EINTR {
		t.Fatal(err)
	}
	return n > 0
}

// TestLine: a strict pair carries bytes while both ends agree on their
// line settings, and loses them while one end is at another speed.
func TestLine(t *testing.T) {
	a, b := nullmodem.OpenLine(t)
	fa, fb := raw(t, a), raw(t, b)
	msg := []byte{0x07, 0x03, 0x00, 0x00, 0x00, 0x01, 0x84, 0x6c}
	send := func(want bool) {
		t.Helper()
		if _, err := fa.Write(msg); err != nil {
			t.Fatal(err)
		}
		if got := readable(t, fb, 300*time.Millisecond); got != want {
			t.Fatalf("bytes arrived: %v, want %v", got, want)
		}
		if want {
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(fb, got); err != nil || string(got) != string(msg) {
				t.Fatalf("received % x (%v), want % x", got, err, msg)
			}
		}
	}
	setSpeed(t, fa, unix.B19200)
	setSpeed(t, fb, unix.B19200)
	send(true)
	setSpeed(t, fb, unix.B9600)
	send(false)
	setSpeed(t, fb, unix.B19200)
	send(true)
}
