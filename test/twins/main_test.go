// Package twins tests DeviceModels, Devices and their twins against a real
// kube-apiserver and etcd (built by hack/build-k8s.sh): CRD validation,
// Devices made from Instances, the twin sync and the status writer.
package twins

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dowse-dev/dowse/shared/scheme"
	"github.com/dowse-dev/dowse/test/kube"
	"github.com/dowse-dev/dowse/test/testwait"
)

var (
	cp        *kube.ControlPlane
	k8sClient client.Client
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctrllog.SetLogger(logr.Discard())
	var err error
	if cp, err = kube.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping control plane:", err)
		}
	}()
	sch, err := scheme.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if k8sClient, err = client.New(cp.Config, client.Options{Scheme: sch}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "tw-"}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func eventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	testwait.For(t, timeout, f)
}

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
