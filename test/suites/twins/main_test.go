// Package twins tests DeviceModels, Devices and their twins against a real
// kube-apiserver and etcd (built by hack/build-k8s.sh): CRD validation,
// Devices made from Instances, the twin sync and the status writer.
package twins

import (
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/test/framework/kube"
)

var suite = &kube.Suite{NamespacePrefix: "tw-"}

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

// writeCounter counts writes to one resource path fragment.
type writeCounter struct {
	match  string
	writes atomic.Int64
	mu     sync.Mutex
	paths  map[string]int64
}

func (c *writeCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method != http.MethodGet && strings.Contains(r.URL.Path, c.match) {
			c.writes.Add(1)
			c.mu.Lock()
			if c.paths == nil {
				c.paths = map[string]int64{}
			}
			c.paths[r.URL.Path]++
			c.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

// to counts the writes to the paths that end with suffix (one object's).
func (c *writeCounter) to(suffix string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for p, k := range c.paths {
		if strings.HasSuffix(p, suffix) {
			n += k
		}
	}
	return n
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func keyOf(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
