package handler

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"unicode/utf8"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// Bounds of what a stream reports as skipped: the agent writes it into the
// Configuration's status, so it must stay small however many candidates a
// network holds.
const (
	// MaxSkippedReasons is the most reasons sent; those with the most
	// candidates are kept.
	MaxSkippedReasons = 16
	// MaxSkippedCandidates is the most candidates named per reason: the
	// first in the order of their names, so that the same candidates give
	// the same summary whatever order they were added in (the agent writes
	// a status only when the summary changes).
	MaxSkippedCandidates = 5
	// maxSkippedText bounds a candidate's name and message, in bytes.
	maxSkippedText = 256
)

// Skipped collects the candidates a Discoverer looked at and did not report
// as devices, with why. The zero value is empty and ready to use; it is safe
// for concurrent use. Give it to SetSkipped.
type Skipped struct {
	mu      sync.Mutex
	reasons map[string]*discoveryv1.SkippedReason
}

// Add notes that candidate (an address, a URL, a device path) was skipped
// for reason, a short UpperCamelCase cause (AuthRefused, NoReply,
// Filtered), with a message saying what happened in the handler's words.
func (s *Skipped) Add(reason, candidate, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reasons == nil {
		s.reasons = map[string]*discoveryv1.SkippedReason{}
	}
	r := s.reasons[reason]
	if r == nil {
		r = &discoveryv1.SkippedReason{Reason: truncate(reason, 64)}
		s.reasons[reason] = r
	}
	r.Count++
	c := &discoveryv1.SkippedCandidate{Candidate: truncate(candidate, maxSkippedText), Message: truncate(message, maxSkippedText)}
	i, _ := slices.BinarySearchFunc(r.Candidates, c, compareCandidates)
	if i < MaxSkippedCandidates {
		r.Candidates = slices.Insert(r.Candidates, i, c)
		if len(r.Candidates) > MaxSkippedCandidates {
			r.Candidates = r.Candidates[:MaxSkippedCandidates]
		}
	}
}

func compareCandidates(a, b *discoveryv1.SkippedCandidate) int {
	return cmp.Or(cmp.Compare(a.Candidate, b.Candidate), cmp.Compare(a.Message, b.Message))
}

// Len is how many candidates were added.
func (s *Skipped) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.reasons {
		n += int(r.Count)
	}
	return n
}

// list is the bounded summary sent to the agent, sorted by reason.
func (s *Skipped) list() []*discoveryv1.SkippedReason {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reasons) == 0 {
		return nil
	}
	out := make([]*discoveryv1.SkippedReason, 0, len(s.reasons))
	for _, r := range s.reasons {
		out = append(out, r)
	}
	if len(out) > MaxSkippedReasons {
		slices.SortFunc(out, func(a, b *discoveryv1.SkippedReason) int {
			return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Reason, b.Reason))
		})
		out = out[:MaxSkippedReasons]
	}
	slices.SortFunc(out, func(a, b *discoveryv1.SkippedReason) int { return cmp.Compare(a.Reason, b.Reason) })
	// Copies: s may be added to after.
	for i, r := range out {
		out[i] = &discoveryv1.SkippedReason{Reason: r.Reason, Count: r.Count, Candidates: slices.Clone(r.Candidates)}
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// skipState is one stream's current skipped set, read by its sender.
type skipState struct {
	mu   sync.Mutex
	list []*discoveryv1.SkippedReason
}

type skipKey struct{}

// SetSkipped replaces the skipped candidates of the Discover stream of ctx
// (the context Discover was given) with s: they reach the agent with the
// next list passed to send, and on every list after, until SetSkipped is
// called again. So a Discoverer that looks at its candidates in rounds
// calls SetSkipped with what it skipped in the round, then send with what
// it found; one that keeps state sets what is skipped now. The agent shows
// them in the Configuration's status and emits an Event for each reason
// that appears. s is copied; calling SetSkipped with a context that is not
// a Discover stream's does nothing.
func SetSkipped(ctx context.Context, s *Skipped) {
	st, ok := ctx.Value(skipKey{}).(*skipState)
	if !ok {
		return
	}
	cp := s.list()
	st.mu.Lock()
	st.list = cp
	st.mu.Unlock()
}

func (st *skipState) current() []*discoveryv1.SkippedReason {
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.list
}
