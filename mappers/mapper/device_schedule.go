package mapper

import (
	"context"
	"slices"
	"time"
)

// wait sleeps until at (zero: until woken), an update, a push or the end.
func (d *device) wait(ctx context.Context, at time.Time) {
	var timer <-chan time.Time
	if !at.IsZero() {
		dur := time.Until(at)
		if dur <= 0 {
			return
		}
		if d.waitTimer == nil {
			d.waitTimer = time.NewTimer(dur)
		} else {
			d.waitTimer.Reset(dur)
		}
		defer d.waitTimer.Stop()
		timer = d.waitTimer.C
	}
	select {
	case <-ctx.Done():
	case <-d.notify:
	case <-timer:
	case p := <-d.pushes:
		d.handlePush(p)
		// Take whatever else arrived with it before reporting once.
	more:
		for {
			select {
			case p := <-d.pushes:
				d.handlePush(p)
			default:
				break more
			}
		}
	}
}

func (d *device) nextDue() time.Time {
	var at time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	for _, g := range d.groups {
		earlier(g.next)
	}
	earlier(d.resubAt)
	for _, ps := range d.order {
		if ps.hasReported && ps.bad == nil {
			// While reports fail, a heartbeat waits for the retry.
			earlier(later(ps.reportedAt.Add(d.reportCycle(ps)), d.flushRetryAt))
		}
		if !ps.retryAt.IsZero() {
			earlier(ps.retryAt)
		}
	}
	return at
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (d *device) reportCycle(ps *propState) time.Duration {
	if ps.p.ReportCycle > 0 {
		return ps.p.ReportCycle
	}
	return d.m.cfg.DefaultReportCycle
}

// regroup puts the polled properties into groups by collect cycle.
func (d *device) regroup() {
	byCycle := map[time.Duration]*group{}
	now := time.Now()
	d.groups = nil
	for _, ps := range d.order {
		if ps.bad != nil || ps.p.Subscribe {
			continue
		}
		g := byCycle[ps.p.CollectCycle]
		if g == nil {
			g = &group{cycle: ps.p.CollectCycle, next: now}
			byCycle[g.cycle] = g
			d.groups = append(d.groups, g)
		}
		g.props = append(g.props, ps)
		g.ps = append(g.ps, ps.p)
	}
	slices.SortFunc(d.groups, func(a, b *group) int { return int(a.cycle - b.cycle) })
}
