package ingest

import (
	"context"
	"sync"
)

// tracker counts requests in flight and lets Shutdown wait for them once it
// has closed the door to new ones.
type tracker struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{} // closed when closed and n reaches 0
}

func newTracker() *tracker { return &tracker{idle: make(chan struct{})} }

// enter admits a request unless the tracker is closed.
func (t *tracker) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

func (t *tracker) leave() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.closed && t.n == 0 {
		close(t.idle)
	}
}

// close refuses new requests and waits for those in flight, or ctx.
func (t *tracker) close(ctx context.Context) error {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		if t.n == 0 {
			close(t.idle)
		}
	}
	t.mu.Unlock()
	select {
	case <-t.idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
