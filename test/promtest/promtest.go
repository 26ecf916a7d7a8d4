// Package promtest reads metric values in tests and benches: from a
// Prometheus registry, or from a process's /metrics endpoint.
package promtest

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Sum adds up the counter and gauge samples named name whose labels include
// every pair in labels (nil: all series); 0 when there are none.
func Sum(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// Scrape reads a /metrics endpoint and returns the samples of the metric
// name, keyed by the sample's name and labels as the endpoint writes them
// (`name{label="value",...}`).
func Scrape(url, name string) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", url, resp.Status)
	}
	out := map[string]float64{}
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		i := strings.LastIndex(line, " ")
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", url, line, err)
		}
		out[line[:i]] = v
	}
	return out, s.Err()
}
