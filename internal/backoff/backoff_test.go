package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDoublesToMaxAndResets(t *testing.T) {
	b := &Backoff{Initial: time.Second, Max: 5 * time.Second}
	var got []time.Duration
	for range 5 {
		got = append(got, b.Next())
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delays %v, want %v", got, want)
		}
	}
	b.Reset()
	if d := b.Next(); d != time.Second {
		t.Fatalf("after Reset: %v", d)
	}
	if d := b.Peek(); d != 2*time.Second {
		t.Fatalf("Peek: %v", d)
	}
}

func TestJitterStaysInRange(t *testing.T) {
	b := &Backoff{Initial: time.Second, Max: time.Second, Jitter: 0.5}
	lo, hi := time.Second, time.Duration(0)
	for range 1000 {
		d := b.Next()
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < time.Second/2 || hi > time.Second || hi-lo < time.Second/4 {
		t.Fatalf("jittered delays span [%v, %v], want within [500ms, 1s] and spread", lo, hi)
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if Sleep(ctx, time.Minute) || time.Since(start) > time.Second {
		t.Fatal("Sleep outlived its context")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep on a live context reported it dead")
	}
}
