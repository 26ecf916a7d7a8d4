// Package backoff is the one retry delay of Dowse's parts: exponential from
// Initial, doubling up to Max, optionally jittered. It has no dependencies,
// so discovery handlers use it too.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff hands out the delays before successive retries. Its zero value
// is not usable; set Initial and Max. A Backoff is not safe for concurrent
// use: each retry loop (or each key of a map of them) has its own.
type Backoff struct {
	// Initial is the first delay, and the one after Reset.
	Initial time.Duration
	// Max caps the delay.
	Max time.Duration
	// Jitter, in [0, 1], draws each delay uniformly from
	// [d·(1−Jitter), d] instead of d, so that many clients cut off together
	// do not retry in lockstep. Zero: no jitter.
	Jitter float64

	cur time.Duration
}

// Next returns the delay before the next retry and doubles the one after.
func (b *Backoff) Next() time.Duration {
	if b.cur <= 0 {
		b.cur = b.Initial
	}
	d := b.cur
	b.cur = min(2*b.cur, b.Max)
	if b.Jitter > 0 && d > 0 {
		spread := time.Duration(float64(d) * min(b.Jitter, 1))
		d = d - spread + rand.N(spread+1)
	}
	return d
}

// Peek returns the delay Next would return, without jitter, and without
// advancing.
func (b *Backoff) Peek() time.Duration {
	if b.cur <= 0 {
		return b.Initial
	}
	return b.cur
}

// Reset starts again from Initial: call it after a success.
func (b *Backoff) Reset() { b.cur = b.Initial }

// Sleep waits d, or less when ctx ends; it reports whether ctx is still
// alive.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
