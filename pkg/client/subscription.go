package client

import (
	"context"
	"errors"
	"iter"
	"sync"

	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// ErrCallbackSubscription is returned by Next on a subscription read by a
// callback.
var ErrCallbackSubscription = errors.New("client: subscription is read by its callback")

// item is one received event and the connection it came on.
type item struct {
	ev     schema.ClientEvent
	gen    uint64
	lagged bool
}

// Subscription is one subscription: read it with Next or Events, or give it
// a callback with SubscribeFunc. Its state is guarded by its Client's mu.
type Subscription struct {
	c        *Client
	clientID string
	filter   schema.EventFilter

	answer   chan error // the first subscribe's answer
	answered bool

	notify chan struct{} // capacity 1: an event arrived or the end came
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	// Guarded by c.mu.
	id          uint64 // the gateway's id on the current connection; 0 if none
	req         uint64 // the subscribe request awaiting an answer
	gen         uint64 // the connection generation the subscription is on
	abandoned   bool
	callback    bool
	buf         []item
	running     *item // the event whose callback runs
	ended       bool
	endErr      error
	lastSeq     uint64 // stream sequence of the last event received
	resumedFrom uint64 // nonzero while a resume is in flight
	// Where a subscription started from the stream starts (SubscribeOption);
	// replayed events precede the registration point.
	startTime int64 // unix milliseconds
	fromStart bool

	pendingCredit int64
	creditQueued  bool
}

func newSubscription(c *Client, clientID string, filter schema.EventFilter) *Subscription {
	ctx, cancel := context.WithCancel(context.Background())
	return &Subscription{
		c: c, clientID: clientID, filter: filter,
		answer: make(chan error, 1),
		notify: make(chan struct{}, 1),
		ctx:    ctx, cancel: cancel,
		done: make(chan struct{}),
	}
}

// fromStream reports whether s starts from the stream rather than live.
func (s *Subscription) fromStream() bool { return s.startTime != 0 || s.fromStart }

// resolve answers the first Subscribe call once. c.mu held.
func (s *Subscription) resolve(err error) {
	if s.answered {
		return
	}
	s.answered = true
	s.answer <- err
}

func (s *Subscription) wakeReaders() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *Subscription) markDone() { s.once.Do(func() { close(s.done) }) }

// Done is closed when the subscription has ended and, for a callback
// subscription, its callback has returned.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err returns why the subscription ended (matching ErrEnded), or nil while
// it is live.
func (s *Subscription) Err() error {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.endErr
}

// deliver queues a received event. c.mu held.
func (s *Subscription) deliver(ev schema.ClientEvent, seq uint64) error {
	if s.ended {
		return nil
	}
	if len(s.buf) > 2*wire.InitialCredit {
		// The gateway never sends past the bound; refuse to grow without one.
		return errors.New("client: gateway exceeded the subscription's credit")
	}
	lagged := ev.Kind == schema.KindLagged
	s.buf = append(s.buf, item{ev: ev, gen: s.gen, lagged: lagged})
	// A lagged's seq is the last event it counts: a resume continues after
	// it, so no counted event is replayed (EVENT-001, EVENT-031).
	if seq > s.lastSeq {
		s.lastSeq = seq
	}
	s.wakeReaders()
	return nil
}

// heldLocked counts the events held here that the gateway counts against
// the bound: queued, and the one whose callback runs. A lagged event is not
// counted (EVENT-030). c.mu held.
func (s *Subscription) heldLocked() int {
	n := 0
	for i := range s.buf {
		if !s.buf[i].lagged {
			n++
		}
	}
	if s.running != nil && !s.running.lagged {
		n++
	}
	return min(n, wire.InitialCredit)
}

// completeLocked returns the credit of a completed handoff. An event from an
// earlier connection was declared held on resume and is credited on the new
// one; a lagged event from an earlier connection is not, since the new one
// never sent it. Nothing is credited while disconnected. c.mu held.
func (s *Subscription) completeLocked(it *item) {
	if s.ended || (s.id == 0 && s.req == 0) {
		return
	}
	if it.lagged && it.gen != s.gen {
		return
	}
	s.pendingCredit++
	s.c.queueCreditLocked(s)
}

// pop takes the next event, waiting for one. c.mu is not held.
func (s *Subscription) pop(ctx context.Context) (item, error) {
	c := s.c
	for {
		c.mu.Lock()
		if s.ended {
			err := s.endErr
			c.mu.Unlock()
			return item{}, err
		}
		if len(s.buf) > 0 {
			it := s.buf[0]
			s.buf[0] = item{}
			s.buf = s.buf[1:]
			if len(s.buf) == 0 {
				s.buf = nil
			}
			if s.callback {
				s.running = &it
			} else {
				s.completeLocked(&it) // the handoff is Next returning
			}
			c.mu.Unlock()
			return it, nil
		}
		c.mu.Unlock()
		select {
		case <-s.notify:
		case <-ctx.Done():
			return item{}, ctx.Err()
		}
	}
}

// Next returns the subscription's next event, in emission order (EVENT-015),
// waiting for one. It returns an error matching ErrEnded once the
// subscription has ended, even while it waits (EVENT-053).
func (s *Subscription) Next(ctx context.Context) (schema.ClientEvent, error) {
	s.c.mu.Lock()
	cb := s.callback
	s.c.mu.Unlock()
	if cb {
		return schema.ClientEvent{}, ErrCallbackSubscription
	}
	it, err := s.pop(ctx)
	if err != nil {
		return schema.ClientEvent{}, err
	}
	// A wake-up may have been consumed for a later event too.
	s.c.mu.Lock()
	if len(s.buf) > 0 || s.ended {
		s.wakeReaders()
	}
	s.c.mu.Unlock()
	return it.ev, nil
}

// Events ranges over the subscription's events. It stops when the loop
// breaks, when the app ends the subscription or closes the client, and
// yields a final error when ctx ends or the subscription ends for another
// reason.
func (s *Subscription) Events(ctx context.Context) iter.Seq2[schema.ClientEvent, error] {
	return func(yield func(schema.ClientEvent, error) bool) {
		for {
			ev, err := s.Next(ctx)
			if err != nil {
				var ee *EndedError
				if errors.As(err, &ee) && ee.Reason == reasonClosed {
					return
				}
				yield(schema.ClientEvent{}, err)
				return
			}
			if !yield(ev, nil) {
				return
			}
		}
	}
}

const reasonClosed = "closed"

// Close ends the subscription: no event is handed off after it returns and
// a pending Next returns ErrEnded (EVENT-053). It does not wait for a
// running callback, so the callback may call it (EVENT-052).
func (s *Subscription) Close() error {
	c := s.c
	c.mu.Lock()
	c.endLocked(s, &EndedError{Reason: reasonClosed}, true)
	c.mu.Unlock()
	c.signal()
	return nil
}

// runCallbacks hands events to fn one at a time (EVENT-050) until the
// subscription ends.
func (s *Subscription) runCallbacks(fn func(context.Context, schema.ClientEvent) error) {
	defer s.markDone()
	c := s.c
	for {
		it, err := s.pop(s.ctx)
		if err != nil {
			return
		}
		if err := s.call(fn, it.ev); err != nil {
			c.o.onError(err)
		}
		c.mu.Lock()
		s.running = nil
		s.completeLocked(&it)
		more := len(s.buf) > 0
		c.mu.Unlock()
		if more {
			s.wakeReaders()
		}
	}
}

// call runs fn, containing a panic (EVENT-051).
func (s *Subscription) call(fn func(context.Context, schema.ClientEvent) error, ev schema.ClientEvent) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &CallbackPanicError{Value: v}
		}
	}()
	return fn(s.ctx, ev)
}
