package optional

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dowse-dev/dowse/internal/backoff"
)

func TestPartRetriesCountsAndNeverFailsItsManager(t *testing.T) {
	reg := prometheus.NewRegistry()
	failures := NewFailures(reg, "test")
	var runs atomic.Int32
	healthy := make(chan struct{})
	p := &Part{
		Name: "store", Failures: failures,
		Backoff: backoff.Backoff{Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond},
		Run: func(ctx context.Context) error {
			// Each run registers its metrics, as edgehub does.
			Reregistering(reg).MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "per_run_total", Help: "h"}))
			if runs.Add(1) < 3 {
				return errors.New("disk full")
			}
			close(healthy)
			<-ctx.Done()
			return nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Start(ctx) }()
	select {
	case <-healthy:
	case <-time.After(5 * time.Second):
		t.Fatal("the part was not run again after its failures")
	}
	if err := p.Check(nil); err != nil {
		t.Fatalf("Check of a part running again: %v", err)
	}
	if got := testutil.ToFloat64(failures.WithLabelValues("store")); got != 2 {
		t.Fatalf("failures counted: %v, want 2", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Start returned %v, want nil", err)
	}
}

func TestCheckFailsWhileWaitingToRetry(t *testing.T) {
	p := &Part{
		Name:    "listener",
		Backoff: backoff.Backoff{Initial: time.Hour, Max: time.Hour},
		Run:     func(context.Context) error { return errors.New("address in use") },
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Start(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for p.Check(nil) == nil {
		if time.Now().After(deadline) {
			t.Fatal("Check never reported the failure")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := p.Check(nil); err == nil || err.Error() != "listener: address in use" {
		t.Fatalf("Check = %v", err)
	}
}
