package twins

// Acknowledgements follow writes: each node's taken messages in order,
// committed to the hub once their effect is durable; Release.

import (
	"context"
	"slices"
	"time"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
)

// msgRef is one message taken from a node, durable once its effect is
// written (or at once when it had none).
type msgRef struct {
	at      cloudhub.Position
	durable bool
	acks    *nodeAcks // its node's queue
}

// nodeAcks tracks a node's taken messages in order, to commit through the
// last one before the oldest not yet durable.
type nodeAcks struct {
	node   string
	epoch  int64
	stream uint64
	fifo   []*msgRef
}

// noop takes a message that changes nothing: durable at once.
func (s *Status) noop(m cloudhub.Inbound) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if acks, ok := s.acksLocked(m); ok {
		s.pushLocked(acks, m.At, true)
	}
}

// acksLocked returns m's node's message tracking; false when the node's
// session of m's epoch was released (nothing of it is applied or
// committed any more: the edge resends it to the node's new owner).
func (s *Status) acksLocked(m cloudhub.Inbound) (*nodeAcks, bool) {
	if e, ok := s.released[m.Node]; ok {
		if int64(m.Epoch) <= e {
			return nil, false
		}
		delete(s.released, m.Node)
	}
	a := s.nodes[m.Node]
	if a == nil || a.stream != m.At.Stream || a.epoch != int64(m.Epoch) {
		// A new stream (a wiped edge store) or session: what was taken of
		// the old one is no use to commit.
		a = &nodeAcks{node: m.Node, epoch: int64(m.Epoch), stream: m.At.Stream}
		s.nodes[m.Node] = a
	}
	return a, true
}

// pushLocked appends a taken message to its node's queue and commits as
// far as it can.
func (s *Status) pushLocked(a *nodeAcks, at cloudhub.Position, durable bool) *msgRef {
	r := &msgRef{at: at, durable: durable, acks: a}
	a.fifo = append(a.fifo, r)
	if durable {
		s.advanceLocked(a)
	}
	return r
}

// advanceLocked commits a node through its last durable message before
// the first one that is not.
func (s *Status) advanceLocked(a *nodeAcks) {
	var last *msgRef
	i := 0
	for ; i < len(a.fifo) && a.fifo[i].durable; i++ {
		last = a.fifo[i]
	}
	if last == nil {
		return
	}
	a.fifo = slices.Delete(a.fifo, 0, i)
	// A released node's queue commits nothing.
	if s.nodes[a.node] == a && s.hub != nil {
		s.hub.Commit(a.node, last.at)
	}
}

// Connected is cloudhub.SessionObserver's: nothing to do, the node
// resends what was not committed.
func (s *Status) Connected(context.Context, string) {}

// TakenOver is cloudhub.SessionObserver's: Release.
func (s *Status) TakenOver(node string) { s.Release(node) }

// Departed is cloudhub.SessionObserver's: nothing more to drop than what
// the node's Devices' removals drop.
func (s *Status) Departed(string) {}

// Release drops what node reported and was not written yet, for a node
// whose session this replica no longer holds: nothing of it was
// committed, so the edge resends it to its new owner. Messages of the
// released session (its epoch or older) that still arrive are dropped
// uncommitted.
func (s *Status) Release(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := int64(0)
	if a := s.nodes[node]; a != nil {
		e = a.epoch
	}
	if old, ok := s.released[node]; !ok || old < e {
		s.released[node] = e
	}
	delete(s.nodes, node)
	for key, st := range s.devices {
		if st.node == node {
			// Another replica writes its Devices next: what this one
			// wrote is no longer known to be there.
			st.written, st.writtenState = nil, nil
			st.records++
		}
		drop := false
		for _, p := range st.twins {
			drop = drop || p.pos.node == node
		}
		if st.state != nil && st.state.pos.node == node {
			drop = true
		}
		for _, c := range st.conds {
			drop = drop || c.pos.node == node
		}
		if !drop {
			continue
		}
		if st.writing {
			// The write in flight commits nothing (its node's queue is
			// gone); its pending rest is dropped when it ends.
			st.twins, st.state, st.conds, st.extra, st.news, st.prio, st.rush = map[string]*pendingTwin{}, nil, nil, nil, false, prioRepeat, false
			st.urgentAt = time.Time{}
			st.seen = nil
			continue
		}
		delete(s.devices, key)
		s.queue.remove(key)
	}
}

func (s *Status) durableLocked(refs []*msgRef) {
	seen := map[*nodeAcks]bool{}
	for _, r := range refs {
		r.durable = true
		seen[r.acks] = true
	}
	for a := range seen {
		s.advanceLocked(a)
	}
}
