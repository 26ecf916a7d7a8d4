package link

import (
	"errors"
	"slices"
	"testing"
)

// op is one step of a session table test.
type op struct {
	enqueue string // property name of a reported update to enqueue ("" none)
	key     bool   // enqueue with the property as coalescing key
	next    int    // take up to this many entries for writing
	ack     uint64 // peer acks through
	resume  *[2]uint64
	wantErr error
	// Expectations after the step (nil / -1: not checked).
	wantNext []uint64
	wantLen  int
}

func seqs(es []*Entry) []uint64 {
	var s []uint64
	for _, e := range es {
		s = append(s, e.Seq)
	}
	return s
}

func TestSessionSend(t *testing.T) {
	const stream = 77
	resume := func(peer, recv uint64) *[2]uint64 { return &[2]uint64{peer, recv} }
	tests := []struct {
		name string
		cfg  SessionConfig
		ops  []op
	}{
		{"sequence and cumulative ack", SessionConfig{}, []op{
			{enqueue: "a", wantLen: 1}, {enqueue: "b", wantLen: 2}, {enqueue: "c", wantLen: 3},
			{next: 10, wantNext: []uint64{1, 2, 3}, wantLen: 3},
			{ack: 2, wantLen: 1},
			{ack: 1, wantLen: 1},  // old ack: nothing
			{ack: 99, wantLen: 1}, // never assigned: ignored
			{ack: 3, wantLen: 0},
		}},
		{"resume resends what the peer lacks", SessionConfig{StreamID: stream}, []op{
			{enqueue: "a"}, {enqueue: "b"}, {enqueue: "c"},
			{next: 10, wantNext: []uint64{1, 2, 3}},
			{next: 10, wantNext: nil},
			{resume: resume(stream, 1), wantLen: 2},
			{next: 10, wantNext: []uint64{2, 3}},
		}},
		{"resume by a peer that forgot our stream resends all", SessionConfig{StreamID: stream}, []op{
			{enqueue: "a"}, {enqueue: "b"},
			{next: 10, wantNext: []uint64{1, 2}},
			{resume: resume(0, 0), wantLen: 2},
			{next: 1, wantNext: []uint64{1}},
			{next: 5, wantNext: []uint64{2}},
		}},
		{"coalesce an unsent entry with the same key", SessionConfig{}, []op{
			{enqueue: "t", key: true}, {enqueue: "u", key: true}, {enqueue: "t", key: true, wantLen: 2},
			{next: 10, wantNext: []uint64{2, 3}},
		}},
		{"no coalescing with a sent entry", SessionConfig{}, []op{
			{enqueue: "t", key: true}, {next: 10, wantNext: []uint64{1}},
			{enqueue: "t", key: true, wantLen: 2}, {next: 10, wantNext: []uint64{2}},
		}},
		{"full refuses", SessionConfig{MaxEntries: 2}, []op{
			{enqueue: "a"}, {enqueue: "b"}, {enqueue: "c", wantErr: ErrQueueFull, wantLen: 2},
			{ack: 1, wantLen: 1}, {enqueue: "c", wantLen: 2}, {next: 10, wantNext: []uint64{2, 3}},
		}},
		{"full drops oldest", SessionConfig{MaxEntries: 2, DropOldest: true}, []op{
			{enqueue: "a"}, {enqueue: "b"}, {enqueue: "c", wantLen: 2},
			{next: 10, wantNext: []uint64{2, 3}},
		}},
		{"restored entries are resent first", SessionConfig{Unacked: []*Entry{
			{Seq: 5, Env: twinReported(5, "d", "x", 1)}, {Seq: 6, Env: twinReported(6, "d", "y", 1)}}}, []op{
			{enqueue: "z", wantLen: 3},
			{next: 10, wantNext: []uint64{5, 6, 7}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSession(tc.cfg)
			for i, o := range tc.ops {
				switch {
				case o.enqueue != "":
					key := ""
					if o.key {
						key = o.enqueue
					}
					_, _, err := s.Enqueue(twinReported(0, "d", o.enqueue, 1), key)
					if !errors.Is(err, o.wantErr) {
						t.Fatalf("step %d: err %v, want %v", i, err, o.wantErr)
					}
				case o.next > 0:
					got, _ := s.Next(o.next, nil)
					if !slices.Equal(seqs(got), o.wantNext) {
						t.Fatalf("step %d: next %v, want %v", i, seqs(got), o.wantNext)
					}
				case o.ack > 0:
					s.Ack(o.ack)
				case o.resume != nil:
					s.Resume(o.resume[0], o.resume[1])
				}
				if o.wantLen != 0 || o.ack > 0 {
					if n, _ := s.Len(); n != o.wantLen {
						t.Fatalf("step %d: len %d, want %d", i, n, o.wantLen)
					}
				}
			}
		})
	}
}

func TestSessionReceive(t *testing.T) {
	tests := []struct {
		name  string
		peer  []uint64 // SetPeer before each seq (0: unchanged)
		seqs  []uint64
		wantD []uint64 // delivered
	}{
		{"in order", nil, []uint64{1, 2, 3}, []uint64{1, 2, 3}},
		{"duplicates dropped", nil, []uint64{1, 2, 2, 1, 3, 3}, []uint64{1, 2, 3}},
		{"resent after reconnect", nil, []uint64{1, 2, 3, 2, 3, 4}, []uint64{1, 2, 3, 4}},
		{"gap from coalescing accepted", nil, []uint64{1, 4, 6}, []uint64{1, 4, 6}},
		{"fresh receiver accepts any start", nil, []uint64{501, 502, 501}, []uint64{501, 502}},
		{"new peer stream restarts", []uint64{9, 0, 0, 10, 0}, []uint64{5, 6, 6, 1, 2}, []uint64{5, 6, 1, 2}},
		{"same peer stream keeps position", []uint64{9, 0, 9, 0}, []uint64{5, 6, 6, 7}, []uint64{5, 6, 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSession(SessionConfig{})
			var got []uint64
			for i, q := range tc.seqs {
				if i < len(tc.peer) && tc.peer[i] != 0 {
					s.SetPeer(tc.peer[i])
				}
				if s.Accept(q) {
					got = append(got, q)
					s.Delivered(q)
				}
			}
			if !slices.Equal(got, tc.wantD) {
				t.Fatalf("delivered %v, want %v", got, tc.wantD)
			}
		})
	}
}

// TestSessionManualCommit: with ManualCommit the ack told to the peer is
// what the application committed, within the current peer stream, never
// beyond what was delivered.
func TestSessionManualCommit(t *testing.T) {
	for _, manual := range []bool{false, true} {
		s := NewSession(SessionConfig{ManualCommit: manual})
		s.SetPeer(5)
		for seq := uint64(1); seq <= 3; seq++ {
			if !s.Accept(seq) {
				t.Fatalf("seq %d refused", seq)
			}
			s.Delivered(seq)
		}
		want := uint64(3)
		if manual {
			want = 0
		}
		if got := s.AckPosition(); got != want {
			t.Fatalf("manual=%v: ack %d before any commit, want %d", manual, got, want)
		}
		s.Commit(5, 2)
		if manual {
			want = 2
		}
		if got := s.AckPosition(); got != want {
			t.Fatalf("manual=%v: ack %d after commit 2, want %d", manual, got, want)
		}
		if !manual {
			continue
		}
		s.Commit(5, 9) // beyond delivered: the ack stays within it
		if got := s.AckPosition(); got != 3 {
			t.Fatalf("ack %d after committing past delivery, want 3", got)
		}
		s.SetPeer(6) // the peer started afresh
		s.Commit(5, 10)
		if got := s.AckPosition(); got != 0 {
			t.Fatalf("ack %d after a commit in the old stream, want 0", got)
		}
		s.Delivered(1)
		s.Commit(6, 1)
		if got := s.AckPosition(); got != 1 {
			t.Fatalf("ack %d in the new stream, want 1", got)
		}
	}
}
