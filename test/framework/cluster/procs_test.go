package cluster

import (
	"os"
	"slices"
	"testing"

	"github.com/dowse-dev/dowse/test/framework/procs"
)

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/tmp/a\040b/c`); got != "/tmp/a b/c" {
		t.Fatalf("got %q", got)
	}
}

// TestDescendants checks the kill order: a process's children come before it,
// so a shim's containers die before the shim that would reap them.
func TestDescendants(t *testing.T) {
	all := []procInfo{{pid: 10, ppid: 1}, {pid: 11, ppid: 10}, {pid: 12, ppid: 11}, {pid: 13, ppid: 10}, {pid: 20, ppid: 1}}
	got := descendants(all, 10)
	if !slices.Equal(got, []int{12, 11, 13}) {
		t.Fatalf("got %v", got)
	}
}

func TestStartTime(t *testing.T) {
	a, err := procs.StartTime(os.Getpid())
	if err != nil || a == 0 {
		t.Fatalf("start time %d, %v", a, err)
	}
}
