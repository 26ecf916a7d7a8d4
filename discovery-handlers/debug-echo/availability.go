package debugecho

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
)

// offline is the availability file content that takes the devices away.
const offline = "OFFLINE"

// defaultSettle is how long availability waits after an event before it
// reads the file. A direct write is two events, a truncation and the write,
// and a read between them would see an empty file (ONLINE) and flap every
// stream for a moment; a few milliseconds merge them.
const defaultSettle = 5 * time.Millisecond

// availability follows the availability file and tells every stream when
// the devices go offline or come back. It is a small broadcaster: a reader
// takes the current state with a channel that is closed at the next change,
// so any number of streams wait on it and none can hold up another.
type availability struct {
	path   string
	log    logr.Logger
	settle time.Duration

	mu      sync.Mutex
	online  bool
	changed chan struct{}
}

// newAvailability reads the file at once, so that the first stream sees the
// right state even before Start runs.
func newAvailability(path string, log logr.Logger) (*availability, error) {
	// fsnotify names events by the watched directory's path, so the file's
	// path is made absolute and clean to compare with them.
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("availability file %q: %w", path, err)
	}
	a := &availability{
		path:    abs,
		log:     log.WithValues("availabilityFile", abs),
		settle:  defaultSettle,
		changed: make(chan struct{}),
	}
	a.online = a.read()
	return a, nil
}

// Online returns whether the devices are online, and a channel closed at the
// next change.
func (a *availability) Online() (bool, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.online, a.changed
}

// Start watches the file until ctx ends. It watches the file's directory
// rather than the file, so that a file that does not exist yet, is replaced
// by a rename, or is deleted and written again is still followed.
func (a *availability) Start(ctx context.Context) error {
	dir := filepath.Dir(a.path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("creating the availability file's directory: %w", err)
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching the availability file: %w", err)
	}
	defer watcher.Close()
	if err := watcher.Add(dir); err != nil {
		return fmt.Errorf("watching the availability file's directory %s: %w", dir, err)
	}
	// The file may have changed before the watch began.
	a.refresh()

	var settled <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-watcher.Events:
			if !ok {
				return nil
			}
			// Events during the wait are absorbed rather than restarting
			// it, so a file rewritten without pause is still read.
			if filepath.Clean(ev.Name) == a.path && settled == nil {
				settled = time.After(a.settle)
			}
		case err, ok := <-watcher.Errors:
			if !ok {
				return nil
			}
			a.log.Error(err, "watching the availability file failed")
			if errors.Is(err, fsnotify.ErrEventOverflow) && settled == nil {
				// The lost events may have been about the file.
				settled = time.After(a.settle)
			}
		case <-settled:
			settled = nil
			a.refresh()
		}
	}
}

// read reports whether the file says the devices are online. A missing
// file means online, and so, with an error logged, does an unreadable one:
// OFFLINE must be asked for.
func (a *availability) read() bool {
	content, err := os.ReadFile(a.path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			a.log.Error(err, "could not read the availability file, taking the devices as online")
		}
		return true
	}
	return string(bytes.TrimSpace(content)) != offline
}

// refresh reads the file and, when the state changed, wakes every stream.
func (a *availability) refresh() {
	online := a.read()
	a.mu.Lock()
	defer a.mu.Unlock()
	if online == a.online {
		return
	}
	a.online = online
	close(a.changed)
	a.changed = make(chan struct{})
	a.log.Info("device availability changed", "online", online)
}
