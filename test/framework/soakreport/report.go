// Package soakreport holds what a soak run measured (each process's
// resources over time, each fault's time to recover) and writes it as one
// HTML page with inline SVG plots drawn here, and judges growth that does
// not level off.
package soakreport

import (
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// Point is one sample of a series: At is the time since the run started.
type Point struct {
	At    time.Duration
	Value float64
}

// Series is one process incarnation's samples of one resource (a
// restarted process is a new series: its figures start again).
type Series struct {
	// Process names the process ("agent edge-a"), Pid its incarnation.
	Process string
	Pid     int
	Points  []Point
}

// Fault is one injected fault and how long Dowse took to converge after it.
type Fault struct {
	Kind string
	// At is when it was injected, since the run started.
	At time.Duration
	// Recovered is the time from the end of the fault (the restart, the
	// link restored) until everything converged; zero with Err set when it
	// did not.
	Recovered time.Duration
	Err       string
}

// Report is a soak run's figures.
type Report struct {
	Title    string
	Duration time.Duration
	// Summary lines, shown as a list.
	Summary []string
	// Resources: "RSS (MiB)", "goroutines", "open files" -> series.
	Resources map[string][]Series
	Faults    []Fault
	// Growth is the verdict of each compared series, as Judge says it.
	Growth []Growth
}

// Growth compares a series' median over the last third of its life with
// its median over the middle third.
type Growth struct {
	Resource, Process string
	Pid               int
	Middle, Last      float64
	// Limit is the largest Last that counts as levelled off.
	Limit float64
	OK    bool
}

// Pct is the growth from the middle third to the last, in percent.
func (g Growth) Pct() float64 {
	if g.Middle == 0 {
		return 0
	}
	return 100 * (g.Last - g.Middle) / g.Middle
}

func (g Growth) String() string {
	verdict := "levels off"
	if !g.OK {
		verdict = "GROWS"
	}
	return fmt.Sprintf("%s of %s (pid %d): middle third %.1f, last third %.1f (%+.1f %%, limit %.1f): %s",
		g.Resource, g.Process, g.Pid, g.Middle, g.Last, g.Pct(), g.Limit, verdict)
}

// Judge compares the middle and last thirds of a series that has at least
// minPoints samples (nil for a shorter one): growth that levels off stays
// within factor times the middle third plus slack.
func Judge(resource string, s Series, minPoints int, factor, slack float64) *Growth {
	n := len(s.Points)
	if n < minPoints || n < 6 {
		return nil
	}
	vals := func(from, to int) []float64 {
		var v []float64
		for _, p := range s.Points[from:to] {
			v = append(v, p.Value)
		}
		return v
	}
	g := &Growth{Resource: resource, Process: s.Process, Pid: s.Pid,
		Middle: median(vals(n/3, 2*n/3)), Last: median(vals(2*n/3, n))}
	g.Limit = g.Middle*factor + slack
	g.OK = g.Last <= g.Limit
	return g
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// WriteFile writes the report as HTML to path, or to soak.html in it when
// path is a directory.
func (r *Report) WriteFile(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		path = filepath.Join(path, "soak.html")
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := r.WriteHTML(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WriteHTML writes the report as one HTML page, plots inline.
func (r *Report) WriteHTML(w io.Writer) error {
	var b strings.Builder
	esc := html.EscapeString
	fmt.Fprintf(&b, "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>%s</title>\n", esc(r.Title))
	b.WriteString("<style>body{font-family:sans-serif;margin:2em;max-width:1000px}table{border-collapse:collapse}" +
		"td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}.bad{color:#b00}svg{background:#fafafa}</style></head><body>\n")
	fmt.Fprintf(&b, "<h1>%s</h1>\n<p>Run of %s.</p>\n<ul>\n", esc(r.Title), r.Duration.Round(time.Second))
	for _, s := range r.Summary {
		fmt.Fprintf(&b, "<li>%s</li>\n", esc(s))
	}
	b.WriteString("</ul>\n<h2>Time to recover per fault</h2>\n")
	b.WriteString(faultsSVG(r.Faults))
	b.WriteString("<table><tr><th>at</th><th>fault</th><th>converged after</th></tr>\n")
	for _, f := range r.Faults {
		rec := f.Recovered.Round(100 * time.Millisecond).String()
		cls := ""
		if f.Err != "" {
			rec, cls = "not converged: "+f.Err, " class=\"bad\""
		}
		fmt.Fprintf(&b, "<tr%s><td>%s</td><td>%s</td><td>%s</td></tr>\n", cls, f.At.Round(time.Second), esc(f.Kind), esc(rec))
	}
	b.WriteString("</table>\n")
	resources := make([]string, 0, len(r.Resources))
	for k := range r.Resources {
		resources = append(resources, k)
	}
	sort.Strings(resources)
	for _, res := range resources {
		fmt.Fprintf(&b, "<h2>%s over time</h2>\n", esc(res))
		b.WriteString(linesSVG(r.Resources[res], r.Duration, r.Faults))
	}
	b.WriteString("<h2>Growth: last third of each process's life against its middle third</h2>\n<ul>\n")
	for _, g := range r.Growth {
		cls := ""
		if !g.OK {
			cls = " class=\"bad\""
		}
		fmt.Fprintf(&b, "<li%s>%s</li>\n", cls, esc(g.String()))
	}
	b.WriteString("</ul>\n</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

const (
	width, height = 900, 300
	left, bottom  = 60, 30
	top, right    = 10, 170
)

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// linesSVG plots each process's series (its incarnations in one colour),
// with a tick on the time axis at each fault.
func linesSVG(series []Series, d time.Duration, faults []Fault) string {
	maxV := 0.0
	for _, s := range series {
		for _, p := range s.Points {
			maxV = max(maxV, p.Value)
		}
	}
	if maxV == 0 {
		maxV = 1
	}
	maxV *= 1.1
	if d <= 0 {
		d = time.Second
	}
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	x := func(t time.Duration) float64 { return float64(left) + pw*float64(t)/float64(d) }
	y := func(v float64) float64 { return float64(top) + ph*(1-v/maxV) }
	var b strings.Builder
	fmt.Fprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-size=\"11\">\n", width, height)
	axes(&b, d, maxV, x, y)
	for _, f := range faults {
		fmt.Fprintf(&b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#d62728\" stroke-opacity=\"0.3\"><title>%s</title></line>\n",
			x(f.At), top, x(f.At), height-bottom, html.EscapeString(f.Kind))
	}
	colour := map[string]string{}
	var names []string
	for _, s := range series {
		if _, ok := colour[s.Process]; !ok {
			colour[s.Process] = palette[len(names)%len(palette)]
			names = append(names, s.Process)
		}
		var pts []string
		for _, p := range s.Points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.At), y(p.Value)))
		}
		fmt.Fprintf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"><title>%s (pid %d)</title></polyline>\n",
			colour[s.Process], strings.Join(pts, " "), html.EscapeString(s.Process), s.Pid)
	}
	for i, n := range names {
		ly := top + 14*i + 10
		fmt.Fprintf(&b, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"3\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">%s</text>\n",
			width-right+10, ly-4, colour[n], width-right+25, ly, html.EscapeString(n))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func axes(b *strings.Builder, d time.Duration, maxV float64, x func(time.Duration) float64, y func(float64) float64) {
	fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000\"/>\n", left, height-bottom, width-right, height-bottom)
	fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000\"/>\n", left, top, left, height-bottom)
	for i := 0; i <= 4; i++ {
		v := maxV * float64(i) / 4
		fmt.Fprintf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n", left-4, y(v)+4, v)
		t := d * time.Duration(i) / 4
		fmt.Fprintf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x(t), height-bottom+16, t.Round(time.Second))
	}
}

// faultsSVG is a bar per fault: its time to recover.
func faultsSVG(faults []Fault) string {
	if len(faults) == 0 {
		return ""
	}
	maxS := 1.0
	for _, f := range faults {
		maxS = max(maxS, f.Recovered.Seconds())
	}
	maxS *= 1.1
	h := 20*len(faults) + 20
	var b strings.Builder
	fmt.Fprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-size=\"11\">\n", width, h)
	const labelW = 260
	pw := float64(width - labelW - 80)
	for i, f := range faults {
		yy := 10 + 20*i
		fill := "#1f77b4"
		label := fmt.Sprintf("%.1f s", f.Recovered.Seconds())
		w := pw * f.Recovered.Seconds() / maxS
		if f.Err != "" {
			fill, label, w = "#d62728", "not converged", pw
		}
		fmt.Fprintf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s %s</text>\n", labelW-6, yy+12, f.At.Round(time.Second), html.EscapeString(f.Kind))
		fmt.Fprintf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"14\" fill=\"%s\"/>\n", labelW, yy, w, fill)
		fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%d\">%s</text>\n", float64(labelW)+w+4, yy+12, label)
	}
	b.WriteString("</svg>\n")
	return b.String()
}
