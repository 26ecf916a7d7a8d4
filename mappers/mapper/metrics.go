package mapper

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Metrics are a mapper's Prometheus metrics, served in the Prometheus text
// format by Handler. A nil *Metrics records nothing, so tests and embedders
// need none.
//
// They are kept here rather than with client_golang: that library (and the
// protobuf model, procfs and expfmt it brings) adds about 2.5 MB to a mapper
// binary and 1.5 MiB to its resident memory, on edge nodes where a mapper
// should stay small.
type Metrics struct {
	mu           sync.Mutex
	counters     map[series]float64
	gauges       map[series]float64
	devices      map[string]float64
	readLatency  histogram
	writeLatency histogram
	desiredLag   histogram
}

type series struct{ name, labels string }

var helps = map[string]string{
	"dowse_mapper_reads_total":            "Property reads, by result (ok; error: the device or connection failed; invalid: the property's visitor or value is wrong).",
	"dowse_mapper_writes_total":           "Desired-value writes, by result (ok; error; invalid: refused before or by the device as wrong).",
	"dowse_mapper_reports_total":          "Reports sent to the device manager, by kind (status, states) and result (ok, error).",
	"dowse_mapper_registrations_total":    "MapperRegister calls, by result.",
	"dowse_mapper_connects_total":         "Device connection attempts, by result.",
	"dowse_mapper_auth_retries_total":     "Sign-ins tried again after the device refused the credentials, by what started them (backoff: the wait ran out; credentials: a credential file changed; update: the Device changed).",
	"dowse_mapper_devices":                "Devices served, by state.",
	"dowse_mapper_read_duration_seconds":  "Time of one read exchange with a device (a batch counts once).",
	"dowse_mapper_write_duration_seconds": "Time of one write to a device.",
	"dowse_mapper_sink_sent_total":        "Readings a sink (a property's pushMethod) delivered, by kind (mqtt, http) and address: acknowledged by the broker at QoS 1 and 2, written at QoS 0, answered 2xx over HTTP.",
	"dowse_mapper_sink_dropped_total":     "Readings a sink dropped, oldest first, because its buffer was full (its peer down or slow), by kind and address.",
	"dowse_mapper_sink_refused_total":     "Readings (HTTP 4xx) and logins (MQTT not authorized, bad user name or password) a sink's peer refused, by kind and address.",
	"dowse_mapper_sink_errors_total":      "Failed connections and deliveries of a sink (retried with backoff), by kind and address.",
	"dowse_mapper_sink_connects_total":    "Connections a sink opened, by kind and address.",
	"dowse_mapper_sink_buffered":          "Readings waiting in a sink's buffer, by kind and address.",
	"dowse_mapper_desired_wait_seconds":   "Time from a new desired value reaching the mapper (UpdateDevice, or a registration's answer) to its write starting: the mapper's own queueing.",
}

var buckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

type histogram struct {
	counts []uint64 // per bucket, not cumulative
	sum    float64
	count  uint64
}

func (h *histogram) observe(v float64) {
	if h.counts == nil {
		h.counts = make([]uint64, len(buckets))
	}
	if i, _ := slices.BinarySearch(buckets, v); i < len(buckets) {
		h.counts[i]++
	}
	h.sum += v
	h.count++
}

// NewMetrics returns an empty set of metrics.
func NewMetrics() *Metrics {
	return &Metrics{counters: map[series]float64{}, gauges: map[series]float64{}, devices: map[string]float64{}}
}

func (m *Metrics) add(name, labels string, n float64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.counters[series{name, labels}] += n
	m.mu.Unlock()
}

func (m *Metrics) setGauge(name, labels string, v float64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.gauges[series{name, labels}] = v
	m.mu.Unlock()
}

// deleteGauge removes a gauge's series (its subject is gone).
func (m *Metrics) deleteGauge(name, labels string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	delete(m.gauges, series{name, labels})
	m.mu.Unlock()
}

func (m *Metrics) read(result string, n int) {
	if n > 0 {
		m.add("dowse_mapper_reads_total", `result="`+result+`"`, float64(n))
	}
}

func (m *Metrics) readTook(d time.Duration) {
	if m != nil {
		m.mu.Lock()
		m.readLatency.observe(d.Seconds())
		m.mu.Unlock()
	}
}

func (m *Metrics) write(result string, d time.Duration) {
	if m != nil {
		m.add("dowse_mapper_writes_total", `result="`+result+`"`, 1)
		m.mu.Lock()
		m.writeLatency.observe(d.Seconds())
		m.mu.Unlock()
	}
}

func (m *Metrics) desiredWait(d time.Duration) {
	if m != nil {
		m.mu.Lock()
		m.desiredLag.observe(d.Seconds())
		m.mu.Unlock()
	}
}

func (m *Metrics) report(kind string, err error) {
	m.add("dowse_mapper_reports_total", `kind="`+kind+`",result="`+result(err)+`"`, 1)
}

func (m *Metrics) register(err error) {
	m.add("dowse_mapper_registrations_total", `result="`+result(err)+`"`, 1)
}

func (m *Metrics) connect(err error) {
	m.add("dowse_mapper_connects_total", `result="`+result(err)+`"`, 1)
}

func (m *Metrics) authRetry(trigger string) {
	m.add("dowse_mapper_auth_retries_total", `trigger="`+trigger+`"`, 1)
}

func (m *Metrics) state(from, to string) {
	if m == nil || from == to {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if from != "" {
		m.devices[from]--
	}
	if to != "" {
		m.devices[to]++
	}
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// Value returns one series' value, e.g. Value("dowse_mapper_reads_total",
// `result="ok"`); 0 when absent. Tests read metrics with it.
func (m *Metrics) Value(name, labels string) float64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.gauges[series{name, labels}]; ok {
		return v
	}
	return m.counters[series{name, labels}]
}

// WriteTo writes every metric in the Prometheus text format (0.0.4),
// followed by the Go runtime's and the process's usual gauges.
func (m *Metrics) WriteTo(w io.Writer) (int64, error) {
	bw := bufio.NewWriter(w)
	m.mu.Lock()
	byName := map[string][]series{}
	for s := range m.counters {
		byName[s.name] = append(byName[s.name], s)
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s counter\n", n, helps[n], n)
		ss := byName[n]
		slices.SortFunc(ss, func(a, b series) int { return strings.Compare(a.labels, b.labels) })
		for _, s := range ss {
			fmt.Fprintf(bw, "%s{%s} %s\n", n, s.labels, num(m.counters[s]))
		}
	}
	byName = map[string][]series{}
	for s := range m.gauges {
		byName[s.name] = append(byName[s.name], s)
	}
	names = names[:0]
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s gauge\n", n, helps[n], n)
		ss := byName[n]
		slices.SortFunc(ss, func(a, b series) int { return strings.Compare(a.labels, b.labels) })
		for _, s := range ss {
			fmt.Fprintf(bw, "%s{%s} %s\n", n, s.labels, num(m.gauges[s]))
		}
	}
	fmt.Fprintf(bw, "# HELP dowse_mapper_devices %s\n# TYPE dowse_mapper_devices gauge\n", helps["dowse_mapper_devices"])
	states := make([]string, 0, len(m.devices))
	for s := range m.devices {
		states = append(states, s)
	}
	slices.Sort(states)
	for _, s := range states {
		fmt.Fprintf(bw, "dowse_mapper_devices{state=%q} %s\n", s, num(m.devices[s]))
	}
	writeHistogram(bw, "dowse_mapper_read_duration_seconds", &m.readLatency)
	writeHistogram(bw, "dowse_mapper_write_duration_seconds", &m.writeLatency)
	writeHistogram(bw, "dowse_mapper_desired_wait_seconds", &m.desiredLag)
	m.mu.Unlock()
	writeRuntime(bw)
	return 0, bw.Flush()
}

func writeHistogram(w io.Writer, name string, h *histogram) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, helps[name], name)
	var cum uint64
	for i, b := range buckets {
		if h.counts != nil {
			cum += h.counts[i]
		}
		fmt.Fprintf(w, "%s_bucket{le=%q} %d\n", name, num(b), cum)
	}
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n%s_sum %s\n%s_count %d\n", name, h.count, name, num(h.sum), name, h.count)
}

func writeRuntime(w io.Writer) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gauge := func(name, help string, v float64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s %s\n", name, help, name, name, num(v))
	}
	gauge("go_goroutines", "Number of goroutines that currently exist.", float64(runtime.NumGoroutine()))
	gauge("go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use.", float64(ms.HeapInuse))
	gauge("go_memstats_stack_inuse_bytes", "Number of bytes in use by the stack allocator.", float64(ms.StackInuse))
	gauge("go_memstats_sys_bytes", "Number of bytes obtained from system.", float64(ms.Sys))
	fmt.Fprintf(w, "# HELP go_gc_cycles_total Completed GC cycles.\n# TYPE go_gc_cycles_total counter\ngo_gc_cycles_total %d\n", ms.NumGC)
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			if pages, err := strconv.ParseFloat(f[1], 64); err == nil {
				gauge("process_resident_memory_bytes", "Resident memory size in bytes.", pages*float64(os.Getpagesize()))
			}
		}
	}
}

func num(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = m.WriteTo(w)
	})
}
