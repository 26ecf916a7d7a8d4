package procs

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Lines is an io.Writer that keeps what is written to it as lines, for a
// test to wait on a line a process prints (a peer's "listening on").
type Lines struct {
	mu      sync.Mutex
	cond    *sync.Cond
	lines   []string
	at      []time.Time // when each line came
	partial []byte
	ended   bool
	// Each, when set, is called with every complete line.
	Each func(line string)
}

// NewLines returns an empty Lines.
func NewLines() *Lines {
	l := &Lines{}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// Write keeps every complete line of b.
func (l *Lines) Write(b []byte) (int, error) {
	l.mu.Lock()
	l.partial = append(l.partial, b...)
	var done []string
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimSuffix(string(l.partial[:i]), "\r")
		l.partial = l.partial[i+1:]
		l.lines = append(l.lines, line)
		l.at = append(l.at, time.Now())
		done = append(done, line)
	}
	l.cond.Broadcast()
	each := l.Each
	l.mu.Unlock()
	if each != nil {
		for _, line := range done {
			each(line)
		}
	}
	return len(b), nil
}

// End says no more lines come (the process ended): waiters stop waiting.
func (l *Lines) End() {
	l.mu.Lock()
	if len(l.partial) > 0 {
		l.lines = append(l.lines, string(l.partial))
		l.at = append(l.at, time.Now())
		l.partial = nil
	}
	l.ended = true
	l.cond.Broadcast()
	l.mu.Unlock()
}

// EndWith calls End once p has ended and its output is copied.
func (l *Lines) EndWith(p *Proc) {
	go func() {
		<-p.Done()
		l.End()
	}()
}

// Len is how many lines have been written.
func (l *Lines) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// All is a copy of the lines so far.
func (l *Lines) All() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// Count is how many lines contain every one of subs.
func (l *Lines) Count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, line := range l.lines {
		for _, sub := range subs {
			if !strings.Contains(line, sub) {
				continue next
			}
		}
		n++
	}
	return n
}

// First finds the first line from index from on that contains sub, and
// returns when it was written (for a bench's latency) and the index after
// it.
func (l *Lines) First(sub string, from int) (time.Time, int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := from; i < len(l.lines); i++ {
		if strings.Contains(l.lines[i], sub) {
			return l.at[i], i + 1, true
		}
	}
	return time.Time{}, from, false
}

// String is the last lines, as many as a failing test's message can hold.
func (l *Lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	const most = 60
	if len(l.lines) > most {
		return strings.Join(l.lines[len(l.lines)-most:], "\n")
	}
	return strings.Join(l.lines, "\n")
}

// Wait waits for a line starting with prefix, counting from line index from
// (0 for the first), and returns the rest of the line, trimmed, and the
// index after it. It fails when the lines end or timeout passes first.
func (l *Lines) Wait(prefix string, from int, timeout time.Duration) (string, int, error) {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		l.mu.Lock()
		l.cond.Broadcast()
		l.mu.Unlock()
	})
	defer timer.Stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		for i := from; i < len(l.lines); i++ {
			if rest, ok := strings.CutPrefix(l.lines[i], prefix); ok {
				return strings.TrimSpace(rest), i + 1, nil
			}
		}
		if l.ended {
			return "", 0, fmt.Errorf("ended before printing %q; output: %q", prefix, l.lines)
		}
		if !time.Now().Before(deadline) {
			return "", 0, fmt.Errorf("did not print %q within %v; output: %q", prefix, timeout, l.lines)
		}
		l.cond.Wait()
	}
}
