package mapper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dowse-dev/dowse/shared/twinvalue"
)

func (d *device) handlePush(p push) {
	ps := d.props[p.p.Name]
	if ps == nil || ps.p != p.p {
		return // from a property since rebuilt
	}
	d.m.cfg.Metrics.read(readResult(p.err), 1)
	d.record(ps, p.v, p.err, time.Now())
	if errors.Is(p.err, ErrDeviceOffline) {
		// The device said so over a working connection: nothing to
		// reconnect or subscribe again; its next value brings it back.
		d.offlineErr = p.err
		d.setState(twinvalue.StateOffline, p.err)
		return
	}
	if p.err != nil && d.resubAt.IsZero() {
		// A monitored item the server refused (a node not there yet) or a
		// failed publish: subscribe again later, with backoff.
		if d.resubDelay == 0 {
			d.resubDelay = d.m.cfg.ReconnectInitial
		}
		d.resubAt = time.Now().Add(d.resubDelay)
		d.resubDelay = min(2*d.resubDelay, d.m.cfg.ReconnectMax)
	} else if p.err == nil {
		d.resubDelay = 0
	}
	switch {
	case p.err == nil:
		d.failures = 0
		d.backoff = d.m.cfg.ReconnectInitial
		if d.state == twinvalue.StateUnhealthy || d.offlineErr != nil {
			d.offlineErr = nil
			d.setState(twinvalue.StateOK, nil)
		}
	case errors.Is(p.err, ErrDisconnected):
		d.failures, d.lastErr = d.m.cfg.UnhealthyAfter, p.err
	case !IsPermanent(p.err):
		d.failures++
		d.lastErr = p.err
	}
}

func readResult(err error) string {
	switch {
	case err == nil:
		return "ok"
	case IsPermanent(err):
		return "invalid"
	}
	return "error"
}

// readDue reads the groups that are due.
func (d *device) readDue(ctx context.Context, now time.Time) {
	if !d.connected {
		return
	}
	attempted, failed := 0, 0
	for _, g := range d.groups {
		if g.next.After(now) {
			continue
		}
		if attempted > 0 && d.hasNext() {
			// An update came: the groups still due are read right after
			// it is applied (their next stays due).
			break
		}
		// The next read keeps to the cycle's grid, skipping missed beats.
		g.next = g.next.Add(g.cycle)
		if !g.next.After(now) {
			g.next = now.Add(g.cycle)
		}
		results := d.read(ctx, g.ps)
		at := time.Now()
		for i, r := range results {
			ps := g.props[i]
			d.record(ps, r.Value, r.Err, at)
			if r.Err == nil || !IsPermanent(r.Err) {
				attempted++
				if r.Err != nil {
					failed++
					d.lastErr = r.Err
					if errors.Is(r.Err, ErrDisconnected) {
						d.failures = d.m.cfg.UnhealthyAfter
					}
				}
			}
		}
		d.m.cfg.Metrics.read("ok", len(results)-countErr(results))
		for _, r := range results {
			if r.Err != nil {
				d.m.cfg.Metrics.read(readResult(r.Err), 1)
			}
		}
		if ctx.Err() != nil {
			return
		}
	}
	if attempted > 0 {
		if failed == attempted {
			d.failures++
		} else {
			d.failures = 0
			d.backoff = d.m.cfg.ReconnectInitial
			d.offlineErr = nil // it answers
			if d.state != twinvalue.StateOK {
				d.setState(twinvalue.StateOK, nil)
			}
		}
	}
}

func countErr(rs []Result) int {
	n := 0
	for _, r := range rs {
		if r.Err != nil {
			n++
		}
	}
	return n
}

func (d *device) read(ctx context.Context, props []*Property) []Result {
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	start := time.Now()
	defer func() { d.m.cfg.Metrics.readTook(time.Since(start)) }()
	if br, ok := d.driver.(BatchReader); ok && len(props) > 1 {
		rs := br.ReadBatch(cctx, props)
		if len(rs) != len(props) {
			rs = make([]Result, len(props))
			for i := range rs {
				rs[i].Err = fmt.Errorf("driver returned %d results for %d properties", len(rs), len(props))
			}
		}
		return rs
	}
	rs := make([]Result, len(props))
	for i, p := range props {
		rs[i].Value, rs[i].Err = d.driver.Read(cctx, p)
	}
	return rs
}

// record takes one reading (or its failure) and marks what is to report.
func (d *device) record(ps *propState, raw any, err error, at time.Time) {
	if ps == nil {
		return
	}
	if err == nil {
		var s string
		s, err = twinvalue.Format(ps.p.Type, ps.p.Transform.Apply(raw))
		if err == nil {
			ps.value, ps.hasValue, ps.readAt, ps.readErr = s, true, at, ""
			if !ps.hasReported || ps.reportedErr != "" || changed(ps.p.Type, ps.reported, s, ps.p.Deadband) {
				ps.dirty = true
			}
			if ps.sinks != nil && (!ps.hasPushed || changed(ps.p.Type, ps.pushed, s, ps.p.Deadband) || at.Sub(ps.pushedAt) >= d.reportCycle(ps)) {
				d.push(ps, at)
			}
			return
		}
		err = Permanent(err)
	}
	if ps.readErr != err.Error() {
		d.log.Info("reading a property failed", "property", ps.p.Name, "err", err)
	}
	ps.readErr = err.Error()
	if ps.reportedErr != ps.readErr {
		ps.dirty = true
	}
}

// push hands a property's reading to its sinks (each keeps its own copy:
// their buffers drop independently).
func (d *device) push(ps *propState, at time.Time) {
	d.pushBuf = appendPayload(d.pushBuf[:0], d.ns, d.name, ps.p.Name, ps.value, ps.p.Type, at)
	for i := range ps.sinks {
		ps.sinks[i].sink.push(&ps.sinks[i], d.pushBuf, ps.value, at.UnixMilli())
	}
	ps.pushed, ps.hasPushed, ps.pushedAt = ps.value, true, at
}

// releaseSinks gives back the sinks of every property (the device stops).
func (d *device) releaseSinks() {
	for _, ps := range d.order {
		d.m.sinks.release(ps.sinks)
		ps.sinks = nil
	}
}
