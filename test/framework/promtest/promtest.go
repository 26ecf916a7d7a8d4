// Package promtest reads metric values in tests and benches: from a
// Prometheus registry, or from a process's /metrics endpoint.
package promtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"
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

// dowseMetric matches the Dowse metric names a query names.
var dowseMetric = regexp.MustCompile(`\bdowse_[a-z0-9_]+`)

// QueriedMetrics returns the Dowse metrics the chart's Grafana dashboard
// (JSON at dashboard) and alerting rules (a Prometheus rule file at rules)
// query, sorted, failing the test if either does not parse.
func QueriedMetrics(t testing.TB, dashboard, rules string) []string {
	t.Helper()
	seen := map[string]bool{}
	b, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard %s: %v", dashboard, err)
	}
	if len(d.Panels) == 0 {
		t.Fatalf("dashboard %s has no panels", dashboard)
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range dowseMetric.FindAllString(tg.Expr, -1) {
				seen[m] = true
			}
		}
	}
	b, err = os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Groups []struct {
			Rules []struct {
				Expr string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &r); err != nil {
		t.Fatalf("rules %s: %v", rules, err)
	}
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			for _, m := range dowseMetric.FindAllString(rule.Expr, -1) {
				seen[m] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// Families returns the metric families an endpoint serves (names of its
// # TYPE lines).
func Families(t testing.TB, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = true
		}
	}
	return out
}
