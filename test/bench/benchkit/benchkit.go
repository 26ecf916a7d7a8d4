// Package benchkit holds what the benchmarks under test/bench share: an API
// server with a kubeconfig and a client in a temporary directory of their
// own, and the peak anonymous memory of the processes they measure.
package benchkit

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

// KeepEnv, when set, keeps a bench's temporary directory (logs, state) for
// a look after the run.
const KeepEnv = "BENCH_KEEP"

// Cloud is an API server with Dowse's CRDs, a kubeconfig for the binaries
// a bench runs, and a client.
type Cloud struct {
	CP         *kube.ControlPlane
	Dir        string // the bench's temporary directory
	Kubeconfig string
	Client     client.WithWatch
}

// StartCloud starts an API server and makes a temporary directory named
// after prefix holding its kubeconfig; the client uses scheme.
func StartCloud(prefix string, scheme *runtime.Scheme) (*Cloud, error) {
	cp, err := kube.Start()
	if err != nil {
		return nil, err
	}
	c := &Cloud{CP: cp}
	if c.Dir, err = os.MkdirTemp("", prefix); err != nil {
		c.Stop()
		return nil, err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := cp.Kubeconfig(c.Kubeconfig); err != nil {
		c.Stop()
		return nil, err
	}
	if c.Client, err = client.NewWithWatch(cp.Config, client.Options{Scheme: scheme}); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Stop stops the API server and removes the directory (unless KeepEnv is
// set, when it says where it is).
func (c *Cloud) Stop() {
	c.CP.Stop()
	if c.Dir == "" {
		return
	}
	if os.Getenv(KeepEnv) != "" {
		fmt.Fprintf(os.Stderr, "kept %s\n", c.Dir)
		return
	}
	os.RemoveAll(c.Dir)
}

// AnonSampler samples the anonymous resident memory (heap, stacks) of
// processes every 20 ms: the kernel keeps only the peak of the total
// (VmHWM), not of its anonymous part.
type AnonSampler struct {
	mu   sync.Mutex
	peak map[string]int // KiB by process name
	stop chan struct{}
	done chan struct{}
}

// SampleAnon starts sampling ps.
func SampleAnon(ps ...*procs.Proc) *AnonSampler {
	s := &AnonSampler{peak: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				for _, p := range ps {
					if m, err := p.MemoryNow(); err == nil {
						s.mu.Lock()
						s.peak[p.Name] = max(s.peak[p.Name], m.Anon)
						s.mu.Unlock()
					}
				}
			}
		}
	}()
	return s
}

// Peak is the highest anonymous memory of the process named name so far,
// in KiB.
func (s *AnonSampler) Peak(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak[name]
}

// Stop ends the sampling; it is idempotent.
func (s *AnonSampler) Stop() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}
