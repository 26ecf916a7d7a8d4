package soakreport

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func series(vals ...float64) Series {
	s := Series{Process: "agent edge-a", Pid: 42}
	for i, v := range vals {
		s.Points = append(s.Points, Point{At: time.Duration(i) * time.Second, Value: v})
	}
	return s
}

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals []float64
		ok   bool
	}{
		{"flat after warm-up", []float64{10, 20, 30, 30, 31, 30, 31, 30, 30}, true},
		{"noise within the margin", []float64{30, 30, 30, 30, 32, 30, 34, 33, 35}, true},
		{"keeps growing", []float64{10, 20, 30, 40, 50, 60, 70, 80, 90}, false},
		{"falls", []float64{50, 50, 50, 50, 50, 50, 20, 20, 20}, true},
	} {
		g := Judge("RSS (MiB)", series(tc.vals...), 6, 1.2, 2)
		if g == nil {
			t.Fatalf("%s: no verdict", tc.name)
		}
		if g.OK != tc.ok {
			t.Errorf("%s: %s, want ok=%v", tc.name, g, tc.ok)
		}
	}
	if g := Judge("RSS (MiB)", series(1, 2, 3), 6, 1.2, 2); g != nil {
		t.Errorf("three samples judged: %s", g)
	}
}

// TestWriteHTML: the page is well-formed XML inside (each plot parses) and
// names every process, fault and verdict.
func TestWriteHTML(t *testing.T) {
	r := &Report{Title: "soak", Duration: time.Minute, Summary: []string{"0 counters went back"},
		Resources: map[string][]Series{"RSS (MiB)": {series(1, 2, 3, 3, 3, 3), {Process: "replica-0", Pid: 7, Points: []Point{{0, 5}, {30 * time.Second, 6}}}}},
		Faults:    []Fault{{Kind: "kill -9 agent edge-a", At: 10 * time.Second, Recovered: 3 * time.Second}, {Kind: "restart etcd", At: 20 * time.Second, Err: "timed out"}},
	}
	r.Growth = append(r.Growth, *Judge("RSS (MiB)", r.Resources["RSS (MiB)"][0], 6, 1.2, 2))
	var b strings.Builder
	if err := r.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{"agent edge-a", "replica-0", "kill -9 agent edge-a", "3.0 s", "not converged: timed out", "levels off", "<polyline"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	for rest := page; ; {
		i := strings.Index(rest, "<svg")
		if i < 0 {
			break
		}
		j := strings.Index(rest[i:], "</svg>")
		if j < 0 {
			t.Fatal("an unclosed <svg>")
		}
		d := xml.NewDecoder(strings.NewReader(rest[i : i+j+len("</svg>")]))
		for {
			_, err := d.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("a plot is not well-formed: %v", err)
			}
		}
		rest = rest[i+j:]
	}
}

func TestWriteFileIntoDirectory(t *testing.T) {
	dir := t.TempDir()
	r := &Report{Title: "soak", Duration: time.Minute}
	if err := r.WriteFile(dir); err != nil {
		t.Fatalf("writing into a directory: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "soak.html"))
	if err != nil || !strings.Contains(string(b), "<title>soak</title>") {
		t.Fatalf("soak.html in the directory: %v, %.80q", err, b)
	}
	file := filepath.Join(dir, "named.html")
	if err := r.WriteFile(file); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("a file path: %v", err)
	}
}
