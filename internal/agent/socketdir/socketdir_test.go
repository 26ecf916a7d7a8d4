package socketdir

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestPrepare: a socket folder for a group is 2770 and the group's, made
// anew or fixed when it exists; the agent's sockets in it are 0660 and the
// group's. Changing a file's group needs root (or membership).
func TestPrepare(t *testing.T) {
	if os.Getuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root to give files to another group (CI=true: a missing prerequisite fails)")
		}
		t.Skip("needs root to give files to another group")
	}
	const gid = 4242
	state := t.TempDir()
	check := func(path string, want os.FileMode) {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & (os.ModePerm | os.ModeSetgid); got != want || fi.Sys().(*syscall.Stat_t).Gid != gid {
			t.Errorf("%s: mode %v group %d, want %v group %d", path, got, fi.Sys().(*syscall.Stat_t).Gid, want, gid)
		}
	}
	dir := filepath.Join(state, "discovery")
	if err := Prepare(dir, gid); err != nil {
		t.Fatal(err)
	}
	check(dir, 0o770|os.ModeSetgid)
	// An existing folder of another mode (made by the kubelet's hostPath,
	// say) is put right.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Prepare(dir, gid); err != nil {
		t.Fatal(err)
	}
	check(dir, 0o770|os.ModeSetgid)
	sock := filepath.Join(dir, "registration.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := Socket(sock, gid); err != nil {
		t.Fatal(err)
	}
	check(sock, 0o660)
	if entries, _ := os.ReadDir(state); len(entries) != 1 {
		t.Errorf("state directory holds %v, want the socket folder alone (no temporary left)", entries)
	}
}
