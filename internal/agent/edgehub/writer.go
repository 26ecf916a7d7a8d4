package edgehub

// Group commit. Every outbound message is committed to edge.db before the
// call that queued it returns, and one fsync costs milliseconds: one
// transaction per message bounds an edge at a few thousand messages a
// second however many mappers report at once. So one writer goroutine
// takes every message queued meanwhile (up to maxBatch), enqueues them in
// the session and commits them in one transaction, then answers each
// caller.
//
// The session may write a message on the connection before its batch is
// committed. A crash in that window loses only messages whose callers got
// no answer; what must not happen is a restarted edge assigning the same
// sequence numbers again (the cloud would drop the new messages as
// duplicates). So the store's next-seq runs ahead: before a batch could
// reach it, a reservation seqReserve further on is committed first, and a
// restarted session starts after it (gaps are allowed).

import (
	"errors"
	"fmt"

	"github.com/dowse-dev/dowse/internal/link"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

const (
	maxBatch   = 512
	seqReserve = 4096
)

var errClosed = errors.New("edgehub: closed")

// enqReq is one caller's messages, committed in one transaction.
type enqReq struct {
	envs []*linkv1.Envelope
	keys []string
	seqs []uint64
	err  error
	done chan struct{}
}

// submit hands envs to the writer and waits for their commit; on an error
// seqs holds the ones the session took.
func (e *EdgeHub) submit(envs []*linkv1.Envelope, keys []string) ([]uint64, error) {
	r := &enqReq{envs: envs, keys: keys, done: make(chan struct{})}
	select {
	case e.wq <- r:
	case <-e.wstop:
		return nil, errClosed
	}
	<-r.done
	return r.seqs, r.err
}

// writeLoop runs from New until Close.
func (e *EdgeHub) writeLoop() {
	defer close(e.wdone)
	batch := make([]*enqReq, 0, maxBatch)
	for {
		n := 0
		select {
		case <-e.wstop:
			return
		case r := <-e.wq:
			batch = append(batch[:0], r)
			n = len(r.envs)
		}
	fill:
		for n < maxBatch {
			select {
			case r := <-e.wq:
				batch = append(batch, r)
				n += len(r.envs)
			default:
				break fill
			}
		}
		e.commit(batch)
	}
}

// persistLater is the session's Persist: it only collects, commit writes.
// Only the writer goroutine enqueues, so no lock is needed.
func (e *EdgeHub) persistLater(add *link.Entry, removed []uint64) error {
	e.adds = append(e.adds, add)
	e.rems = append(e.rems, removed...)
	return nil
}

func (e *EdgeHub) commit(batch []*enqReq) {
	fail := func(err error) {
		for _, r := range batch {
			if r.err == nil {
				r.err = fmt.Errorf("edge store: %w", err)
			}
			close(r.done)
		}
	}
	n := 0
	for _, r := range batch {
		n += len(r.envs)
	}
	if next := e.sess.NextSeq() + uint64(n); next > e.reserved {
		res := next + seqReserve
		if err := e.store.reserve(res); err != nil {
			fail(err)
			return
		}
		e.reserved = res
	}
	e.adds, e.rems = e.adds[:0], e.rems[:0]
	for _, r := range batch {
		for i, env := range r.envs {
			seq, dropped, err := e.sess.Enqueue(env, r.keys[i])
			if dropped > 0 {
				e.droppedN.Add(uint64(dropped))
				e.dropped.Add(float64(dropped))
			}
			if err != nil {
				r.err = err
				break
			}
			r.seqs = append(r.seqs, seq)
		}
	}
	if len(e.adds) > 0 {
		if err := e.store.persistBatch(e.adds, e.rems); err != nil {
			// The session holds them: they may still reach the cloud while
			// this process runs, but a restart would not have them.
			fail(err)
			return
		}
	}
	e.removed.Add(uint64(len(e.rems)))
	for _, r := range batch {
		close(r.done)
	}
}
