package procs

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestRunWaitsForLinesAndStops(t *testing.T) {
	out := NewLines()
	var each []string
	out.Each = func(l string) { each = append(each, l) }
	p, err := Run("sh", "sh", []string{"-c", "echo starting; echo 'listening on 127.0.0.1:1'; exec sleep 60"}, Options{Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	out.EndWith(p)
	addr, next, err := out.Wait("listening on", 0, 10*time.Second)
	if err != nil || addr != "127.0.0.1:1" || next != 2 {
		t.Fatalf("Wait = %q, %d, %v", addr, next, err)
	}
	if _, _, err := out.Wait("listening on", next, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "within") {
		t.Fatalf("a line that never comes: %v", err)
	}
	// Another handle on the same process, as a later command has it.
	again := Attach(p.Record)
	if !again.Alive() || p.StartTime == 0 {
		t.Fatalf("attached: alive %v, start time %d", again.Alive(), p.StartTime)
	}
	p.StopWithin(5 * time.Second)
	if p.Alive() || again.Alive() {
		t.Fatal("still alive after Stop")
	}
	if _, _, err := out.Wait("never", 0, 10*time.Second); err == nil || !strings.Contains(err.Error(), "ended") {
		t.Fatalf("waiting after the end: %v", err)
	}
	if len(each) != 2 || out.Len() != 2 {
		t.Fatalf("Each saw %q, Len %d", each, out.Len())
	}
	// A pid reused by a stranger is not ours.
	if Attach(Record{Name: "x", ID: p.Pid(), StartTime: p.StartTime + 1}).Alive() {
		t.Fatal("a record with another start time counts as alive")
	}
}

func TestCPUTimeOfThisProcess(t *testing.T) {
	if _, err := CPUTime(1 << 30); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
	d, err := CPUTime(selfPid())
	if err != nil || d < 0 {
		t.Fatalf("CPUTime = %v, %v", d, err)
	}
}

func selfPid() int { return os.Getpid() }

// TestFreePortBelowEphemeral: the ports handed out are free and outside the
// kernel's ephemeral range, where outgoing connections take theirs.
func TestFreePortBelowEphemeral(t *testing.T) {
	for range 20 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if p < 20000 || p >= ephemeralStart() {
			t.Fatalf("port %d, want one in 20000-%d", p, ephemeralStart()-1)
		}
	}
}

func TestLinesCountFirst(t *testing.T) {
	l := NewLines()
	_, _ = l.Write([]byte("a x\nb y\na y\npart"))
	if n := l.Count("a"); n != 2 {
		t.Errorf("Count(a) = %d, want 2", n)
	}
	if n := l.Count("a", "y"); n != 1 {
		t.Errorf("Count(a, y) = %d, want 1", n)
	}
	if _, next, ok := l.First("y", 0); !ok || next != 2 {
		t.Errorf("First(y, 0) = %d %v, want 2 true", next, ok)
	}
	if _, next, ok := l.First("y", 2); !ok || next != 3 {
		t.Errorf("First(y, 2) = %d %v, want 3 true", next, ok)
	}
	if l.Count("part") != 0 {
		t.Error("a partial line counts before its end")
	}
	l.End()
	if at, _, ok := l.First("part", 0); !ok || at.IsZero() {
		t.Error("the last partial line is not kept at End")
	}
}
