// Package queue is the bounded queue of one subscription at the gateway, with
// the lagged count of EVENT-030 and EVENT-031.
//
// The bound is counted end to end: an event occupies a slot from the moment it
// is accepted until the SDK returns its credit, that is while it waits here,
// while it travels, while the SDK holds it, and while its callback runs. The
// gateway therefore never holds back an accepted event for want of credit: a
// slot is taken on Push and given back by Credit. Past the bound a new event
// is discarded and counted; one pending lagged marker sits at the position of
// the first discard and is handed off before any event accepted after it.
//
// A marker counts one unbroken run of the subscription's events and carries
// the stream sequence of the last, so an SDK that resumes after it neither
// receives a counted event again nor misses one uncounted: a discard while
// events wait behind the pending marker counts them into it too.
//
// A Queue is a pure data structure: it starts no goroutines and is not safe
// for concurrent use; the gateway guards each Queue with its own lock.
package queue

import (
	"errors"
	"fmt"
)

// DefaultCapacity is the bound of EVENT-030.
const DefaultCapacity = 1024

// minBuffer is the first ring allocation; rings grow by doubling up to the
// capacity and are released when they drain, so an idle subscription holds
// no ring at all.
const minBuffer = 8

// ErrCredit reports credit the queue never lent out: more than the events and
// lagged marker sent and not yet credited, or a count below one.
var ErrCredit = errors.New("queue: credit exceeds outstanding handoffs")

// Item is what Pop hands to the writer: an event, or the lagged marker.
type Item[T any] struct {
	// Value is the event; the zero value for a lagged marker.
	Value T
	// Lagged is true for the lagged marker of EVENT-031.
	Lagged bool
	// Discarded is the number of events discarded since the previous lagged
	// marker was handed off; set only when Lagged is true.
	Discarded uint64
	// AtMost marks Discarded as an upper bound: some of the discards were
	// events the gateway could not read or decode, counted by sequences.
	AtMost bool
	// Seq is the stream sequence of the last event a lagged marker counts:
	// every event up to it was handed off before the marker or counted in
	// it, so a resume continues after it (EVENT-001, EVENT-031).
	Seq uint64
}

// Queue is a bounded FIFO of events with lagged accounting. The zero value is
// not usable; call New.
type Queue[T any] struct {
	capacity int
	seq      func(T) uint64

	ring []T
	head int // index of the oldest queued event
	n    int // queued events, not yet popped

	// outstanding counts events popped and not yet credited back (EVENT-030
	// counts them against the bound).
	outstanding int

	// The pending marker: pending discards, and how many queued events are
	// ahead of it. Valid while discards > 0.
	discards uint64
	atMost   bool   // some pending discards are an upper bound
	through  uint64 // the stream sequence of the last pending discard
	markerAt int

	// The marker handed off and not yet credited. Only one may be out at a
	// time so the SDK holds at most one lagged beside its events; lagAt counts
	// the outstanding events sent before it, which credit retires first.
	lagOut bool
	lagAt  int

	totalDiscarded uint64
	totalLagged    uint64
}

// New returns an empty queue bounded at capacity events (EVENT-030), whose
// events have the stream sequences seq reports. A capacity below one is
// raised to one.
func New[T any](capacity int, seq func(T) uint64) *Queue[T] {
	if capacity < 1 {
		capacity = 1
	}
	return &Queue[T]{capacity: capacity, seq: seq}
}

// Capacity reports the bound.
func (q *Queue[T]) Capacity() int { return q.capacity }

// Len reports the events waiting to be popped, excluding a lagged marker.
func (q *Queue[T]) Len() int { return q.n }

// Held reports the events counted against the bound: queued plus popped and
// not yet credited (EVENT-030). A lagged marker is never counted.
func (q *Queue[T]) Held() int { return q.n + q.outstanding }

// Outstanding reports the events popped and not yet credited.
func (q *Queue[T]) Outstanding() int { return q.outstanding }

// PendingDiscards reports the discards not yet handed off in a lagged marker.
func (q *Queue[T]) PendingDiscards() uint64 { return q.discards }

// TotalDiscarded reports every event discarded over the queue's life.
func (q *Queue[T]) TotalDiscarded() uint64 { return q.totalDiscarded }

// TotalLagged reports the lagged markers handed off over the queue's life.
func (q *Queue[T]) TotalLagged() uint64 { return q.totalLagged }

// Push offers a new event. It returns false when the bound is reached: the
// event is discarded and counted into the pending lagged marker (EVENT-030).
func (q *Queue[T]) Push(v T) bool {
	if q.n+q.outstanding >= q.capacity {
		q.Discard(1, q.seq(v))
		return false
	}
	if q.n == len(q.ring) {
		q.grow()
	}
	q.ring[(q.head+q.n)%len(q.ring)] = v
	q.n++
	return true
}

// Hold counts n events that are already held elsewhere (by an SDK resuming a
// subscription on a new connection) against the bound, as popped and not yet
// credited; their credit retires them. n is clamped to the free slots.
func (q *Queue[T]) Hold(n int) {
	if free := q.capacity - q.n - q.outstanding; n > free {
		n = free
	}
	if n > 0 {
		q.outstanding += n
	}
}

// DiscardAtMost is Discard for a count that is an upper bound: the lagged
// item that reports it is marked AtMost.
func (q *Queue[T]) DiscardAtMost(n, through uint64) {
	if n > 0 {
		q.Discard(n, through)
		q.atMost = true
	}
}

// Discard counts n events, the last at stream sequence through, as
// discarded without offering them, for events the gateway knows were emitted
// but did not hand off (past a repair's or a replay's limit). The marker is
// placed behind every queued event, as for a discard by Push.
func (q *Queue[T]) Discard(n, through uint64) {
	if n == 0 {
		return
	}
	if q.discards == 0 {
		// EVENT-031: the marker goes where the first discard happened, so it
		// precedes every event accepted later.
		q.markerAt = q.n
	} else if behind := q.n - q.markerAt; behind > 0 {
		// Events accepted behind the pending marker precede this discard in
		// the stream: the marker counts them too, so that its run has no
		// hole and a resume after its sequence repeats nothing (EVENT-001).
		var zero T
		for i := q.markerAt; i < q.n; i++ {
			q.ring[(q.head+i)%len(q.ring)] = zero
		}
		q.n = q.markerAt
		if q.n == 0 {
			q.release()
		}
		q.discards += uint64(behind)
		q.totalDiscarded += uint64(behind)
	}
	q.discards += n
	q.totalDiscarded += n
	q.through = max(q.through, through)
}

// Ready reports whether Pop would return an item now.
func (q *Queue[T]) Ready() bool {
	if q.discards > 0 && q.markerAt == 0 {
		return q.markerReady()
	}
	return q.n > 0
}

// markerReady reports whether the marker at the head may be handed off: no
// earlier marker is uncredited, and either an event waits behind it or the
// bound has room, so that discarding has stopped. Holding it while the
// bound is full lets one marker count the whole episode (EVENT-031).
func (q *Queue[T]) markerReady() bool {
	return !q.lagOut && (q.n > 0 || q.n+q.outstanding < q.capacity)
}

// Pop returns the next item to hand off, in order: the lagged marker when it
// is at the head, otherwise the oldest event. A popped event stays counted
// against the bound until Credit. Pop returns false when nothing is ready,
// which includes a marker at the head while an earlier marker is still
// uncredited, or while the bound is full and nothing waits behind it:
// events behind a marker wait for it (EVENT-031).
func (q *Queue[T]) Pop() (Item[T], bool) {
	if q.discards > 0 && q.markerAt == 0 {
		if !q.markerReady() {
			return Item[T]{}, false
		}
		it := Item[T]{Lagged: true, Discarded: q.discards, AtMost: q.atMost, Seq: q.through}
		q.discards = 0
		q.atMost = false
		q.lagOut = true
		q.lagAt = q.outstanding
		q.totalLagged++
		return it, true
	}
	if q.n == 0 {
		return Item[T]{}, false
	}
	var zero T
	v := q.ring[q.head]
	q.ring[q.head] = zero // drop the reference for the collector
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	q.outstanding++
	if q.discards > 0 {
		q.markerAt--
	}
	if q.n == 0 {
		q.release()
	}
	return Item[T]{Value: v}, true
}

// Credit retires n handoffs the SDK completed, in the order they were popped;
// a lagged marker counts as one handoff but frees no slot. It returns
// ErrCredit, changing nothing, for n < 1 or more than was handed off.
func (q *Queue[T]) Credit(n int) error {
	out := q.outstanding
	if q.lagOut {
		out++
	}
	if n < 1 || n > out {
		return fmt.Errorf("%w: credit %d, outstanding %d", ErrCredit, n, out)
	}
	if q.lagOut && n > q.lagAt {
		q.lagOut = false
		q.outstanding -= n - 1
		return nil
	}
	if q.lagOut {
		q.lagAt -= n
	}
	q.outstanding -= n
	return nil
}

func (q *Queue[T]) grow() {
	size := len(q.ring) * 2
	if size < minBuffer {
		size = minBuffer
	}
	if size > q.capacity {
		size = q.capacity
	}
	ring := make([]T, size)
	for i := 0; i < q.n; i++ {
		ring[i] = q.ring[(q.head+i)%len(q.ring)]
	}
	q.ring = ring
	q.head = 0
}

// release drops a drained ring larger than the first allocation, so a burst
// does not pin memory on an idle subscription.
func (q *Queue[T]) release() {
	q.head = 0
	if len(q.ring) > minBuffer {
		q.ring = nil
	}
}
