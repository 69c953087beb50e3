package queue

import (
	"errors"
	"math/rand/v2"
	"testing"
)

func intSeq(v int) uint64 { return uint64(v) }

// drain pops everything ready and credits each item at once, as SSE does.
func drain(t *testing.T, q *Queue[int]) []Item[int] {
	t.Helper()
	var got []Item[int]
	for {
		it, ok := q.Pop()
		if !ok {
			return got
		}
		got = append(got, it)
		if err := q.Credit(1); err != nil {
			t.Fatalf("credit: %v", err)
		}
	}
}

func TestBoundHoldsExactlyCapacity_EVENT030(t *testing.T) {
	q := New[int](DefaultCapacity, intSeq)
	for i := range DefaultCapacity {
		if !q.Push(i) {
			t.Fatalf("event %d discarded below the bound", i)
		}
	}
	if q.Held() != DefaultCapacity {
		t.Fatalf("held = %d, want %d", q.Held(), DefaultCapacity)
	}
	for i := range 5 {
		if q.Push(DefaultCapacity + i) {
			t.Fatalf("event %d accepted past the bound", DefaultCapacity+i)
		}
	}
	if q.Held() != DefaultCapacity || q.PendingDiscards() != 5 || q.TotalDiscarded() != 5 {
		t.Fatalf("held=%d pending=%d total=%d", q.Held(), q.PendingDiscards(), q.TotalDiscarded())
	}
}

// Sent and uncredited events count against the bound, end to end.
func TestOutstandingCountsAgainstBound_EVENT030(t *testing.T) {
	q := New[int](4, intSeq)
	for i := range 4 {
		q.Push(i)
	}
	for range 4 {
		if _, ok := q.Pop(); !ok {
			t.Fatal("pop failed")
		}
	}
	if q.Len() != 0 || q.Outstanding() != 4 || q.Held() != 4 {
		t.Fatalf("len=%d outstanding=%d", q.Len(), q.Outstanding())
	}
	if q.Push(99) {
		t.Fatal("accepted an event while the SDK holds the whole window")
	}
	if err := q.Credit(1); err != nil {
		t.Fatal(err)
	}
	if !q.Push(100) {
		t.Fatal("credit did not free a slot")
	}
}

func TestLaggedBeforeLaterEvents_EVENT031(t *testing.T) {
	q := New[int](DefaultCapacity, intSeq)
	for i := range DefaultCapacity {
		q.Push(i)
	}
	const discarded = 37
	for i := range discarded {
		q.Push(-i)
	}
	got := drain(t, q)
	// The app now reads again; new events follow the gap.
	q.Push(5000)
	q.Push(5001)
	got = append(got, drain(t, q)...)

	if len(got) != DefaultCapacity+1+2 {
		t.Fatalf("got %d items", len(got))
	}
	for i := range DefaultCapacity {
		if got[i].Lagged || got[i].Value != i {
			t.Fatalf("item %d = %+v", i, got[i])
		}
	}
	lag := got[DefaultCapacity]
	if !lag.Lagged || lag.Discarded != discarded {
		t.Fatalf("want one lagged{%d} at the gap, got %+v", discarded, lag)
	}
	if got[DefaultCapacity+1].Value != 5000 || got[DefaultCapacity+2].Value != 5001 {
		t.Fatalf("later events out of order: %+v", got[DefaultCapacity+1:])
	}
	if q.TotalLagged() != 1 {
		t.Fatalf("lagged handed off %d times", q.TotalLagged())
	}
}

// The marker sits at the first discard and counts every discard until it is
// handed off; an event accepted behind it before a later discard is counted
// too, so the marker's run ends at its Seq with no hole a resume would fill
// again (EVENT-001, EVENT-031).
func TestOneLaggedCountsSinceLastHandoff_EVENT031(t *testing.T) {
	q := New[int](2, intSeq)
	q.Push(1)
	q.Push(2)
	q.Push(3) // discarded: marker after 2
	it, _ := q.Pop()
	if it.Value != 1 {
		t.Fatalf("got %+v", it)
	}
	if err := q.Credit(1); err != nil {
		t.Fatal(err)
	}
	q.Push(4) // accepted behind the marker
	q.Push(5) // discarded again while the marker is pending: 4 is counted too
	var got []Item[int]
	got = append(got, drain(t, q)...)
	want := []Item[int]{{Value: 2}, {Lagged: true, Discarded: 3, Seq: 5}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("item %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	// A new episode starts a new count.
	q.Push(6)
	q.Push(7)
	q.Push(8)
	got = drain(t, q)
	if len(got) != 3 || !got[2].Lagged || got[2].Discarded != 1 {
		t.Fatalf("second episode: %+v", got)
	}
}

// A pending lagged marker does not take a slot.
func TestPendingLaggedNotCounted_EVENT030(t *testing.T) {
	q := New[int](3, intSeq)
	q.Push(1)
	q.Push(2)
	q.Push(3)
	q.Push(4) // discard
	if q.Held() != 3 {
		t.Fatalf("held = %d", q.Held())
	}
	drain(t, q)
	if q.Held() != 0 {
		t.Fatalf("after drain held = %d", q.Held())
	}
	for i := range 3 {
		if !q.Push(10 + i) {
			t.Fatalf("push %d refused: the lagged marker took a slot", i)
		}
	}
}

// While a lagged marker is uncredited, a second marker waits, and so do the
// events behind it: the SDK never holds two markers.
func TestSecondLaggedWaitsForFirstCredit_EVENT031(t *testing.T) {
	q := New[int](2, intSeq)
	q.Push(1)
	q.Push(2)
	q.Push(3) // discard, marker after 2
	a, _ := q.Pop()
	b, _ := q.Pop()
	if err := q.Credit(1); err != nil { // 1 handed off: room again
		t.Fatal(err)
	}
	c, _ := q.Pop()
	if a.Value != 1 || b.Value != 2 || !c.Lagged || c.Discarded != 1 {
		t.Fatalf("got %+v %+v %+v", a, b, c)
	}
	q.Push(4)
	q.Push(5) // discard: held 2 (2 and 4); a second marker after 4
	if _, ok := q.Pop(); !ok {
		t.Fatal("event 4 not ready")
	}
	if err := q.Credit(1); err != nil { // event 2
		t.Fatal(err)
	}
	q.Push(6) // accepted behind the second marker
	if _, ok := q.Pop(); ok {
		t.Fatal("popped past a marker while the first is uncredited")
	}
	if err := q.Credit(1); err != nil { // the first marker's handoff
		t.Fatal(err)
	}
	d, _ := q.Pop()
	f, _ := q.Pop()
	if !d.Lagged || d.Discarded != 1 || f.Value != 6 {
		t.Fatalf("got %+v %+v", d, f)
	}
}

// While the bound is full and nothing waits behind the marker, the marker is
// held so that one lagged counts the whole episode.
func TestOneLaggedPerEpisodeWhileFull_EVENT031(t *testing.T) {
	q := New[int](2, intSeq)
	q.Push(1)
	q.Push(2)
	q.Pop()
	q.Pop()
	for i := range 10 {
		q.Push(10 + i)
	}
	if q.Ready() {
		t.Fatal("marker ready while the bound is full")
	}
	if err := q.Credit(1); err != nil {
		t.Fatal(err)
	}
	it, ok := q.Pop()
	if !ok || !it.Lagged || it.Discarded != 10 {
		t.Fatalf("got %+v %v", it, ok)
	}
}

func TestCreditRejectsMoreThanOutstanding(t *testing.T) {
	q := New[int](4, intSeq)
	if err := q.Credit(1); !errors.Is(err, ErrCredit) {
		t.Fatalf("credit on empty queue: %v", err)
	}
	q.Push(1)
	q.Pop()
	if err := q.Credit(0); !errors.Is(err, ErrCredit) {
		t.Fatalf("credit 0: %v", err)
	}
	if err := q.Credit(2); !errors.Is(err, ErrCredit) {
		t.Fatalf("credit 2 of 1: %v", err)
	}
	if q.Outstanding() != 1 {
		t.Fatal("a refused credit changed the count")
	}
}

// Credit spanning events on both sides of a marker retires the marker once.
func TestCreditAcrossMarker(t *testing.T) {
	q := New[int](2, intSeq)
	q.Push(1)
	q.Push(2)
	q.Push(3) // discard
	q.Pop()
	q.Pop()
	if err := q.Credit(1); err != nil {
		t.Fatal(err)
	}
	q.Pop() // the lagged marker, now that there is room
	if err := q.Credit(2); err != nil {
		t.Fatal(err)
	}
	if q.Held() != 0 || q.Outstanding() != 0 {
		t.Fatalf("held=%d", q.Held())
	}
	if err := q.Credit(1); !errors.Is(err, ErrCredit) {
		t.Fatal("marker credited twice")
	}
}

func TestUnrepairableGapCountsAsDiscards_EVENT031(t *testing.T) {
	q := New[int](8, intSeq)
	q.Push(1)
	q.Discard(5, 7)
	q.Push(2)
	got := drain(t, q)
	if len(got) != 3 || got[0].Value != 1 || !got[1].Lagged || got[1].Discarded != 5 || got[2].Value != 2 {
		t.Fatalf("got %+v", got)
	}
}

// A count that is an upper bound marks the one lagged that reports it, and
// only that one (EVENT-031).
func TestUpperBoundMarksItsLagged_EVENT031(t *testing.T) {
	q := New[int](8, intSeq)
	q.Discard(2, 2)
	q.DiscardAtMost(5, 7)
	q.Push(1)
	got := drain(t, q)
	if len(got) != 2 || !got[0].Lagged || got[0].Discarded != 7 || !got[0].AtMost || got[1].Value != 1 {
		t.Fatalf("got %+v", got)
	}
	q.Discard(1, 9)
	if got := drain(t, q); len(got) != 1 || got[0].Discarded != 1 || got[0].AtMost {
		t.Fatalf("the next lagged: %+v", got)
	}
}

// A model check: random pushes, pops and credits, the bound never exceeded,
// and every event handed off or counted exactly once, in stream order.
func TestQueueAgainstModelResumesAfterEachItem_EVENT030_EVENT031(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 300 {
		capacity := 1 + r.IntN(16)
		q := New[int](capacity, intSeq)
		next := 1
		var popped []Item[int] // in pop order
		credited := 0          // items of popped credited
		var discards []int     // refused values
		pop := func() bool {
			it, ok := q.Pop()
			if ok {
				popped = append(popped, it)
			}
			return ok
		}
		for range 500 {
			switch r.IntN(3) {
			case 0:
				if !q.Push(next) {
					discards = append(discards, next)
				}
				next++
			case 1:
				pop()
			case 2:
				if out := len(popped) - credited; out > 0 {
					n := 1 + r.IntN(out)
					if err := q.Credit(n); err != nil {
						t.Fatalf("round %d: credit %d: %v", round, n, err)
					}
					credited += n
				}
			}
			if q.Held() > capacity {
				t.Fatalf("round %d: held %d > %d", round, q.Held(), capacity)
			}
		}
		for {
			if pop() {
				continue
			}
			out := len(popped) - credited
			if out == 0 {
				break
			}
			if err := q.Credit(out); err != nil {
				t.Fatal(err)
			}
			credited += out
		}

		// Every value was handed off once or counted once, in stream order:
		// each lagged counts exactly the values after the previous item up
		// to its Seq, so a resume after the last item repeats and misses
		// nothing (EVENT-001, EVENT-031).
		pos := 0
		for i, it := range popped {
			if it.Lagged {
				if it.Discarded == 0 || it.Seq <= uint64(pos) || it.Seq-uint64(pos) != it.Discarded {
					t.Fatalf("round %d: item %d: lagged %+v after position %d", round, i, it, pos)
				}
				pos = int(it.Seq)
				continue
			}
			if it.Value != pos+1 {
				t.Fatalf("round %d: item %d: event %d after position %d", round, i, it.Value, pos)
			}
			pos = it.Value
		}
		if uint64(pos)+q.PendingDiscards() != uint64(next-1) {
			t.Fatalf("round %d: position %d + pending %d != %d events", round, pos, q.PendingDiscards(), next-1)
		}
		if len(discards) > int(q.TotalDiscarded()) {
			t.Fatalf("round %d: %d refused, %d counted", round, len(discards), q.TotalDiscarded())
		}
	}
}

func TestRingReleasedWhenDrained(t *testing.T) {
	q := New[int](DefaultCapacity, intSeq)
	for i := range 100 {
		q.Push(i)
	}
	drain(t, q)
	if q.ring != nil {
		t.Fatalf("ring of %d kept after drain", len(q.ring))
	}
}

// Events an SDK still holds after a reconnect count against the bound of the
// resumed subscription until credited (EVENT-030).
func TestHoldCountsHeldElsewhere_EVENT030(t *testing.T) {
	q := New[int](4, intSeq)
	q.Hold(3)
	if !q.Push(1) || q.Push(2) {
		t.Fatal("held events not counted against the bound")
	}
	if err := q.Credit(3); err != nil {
		t.Fatal(err)
	}
	q.Hold(100)
	if q.Held() != 4 {
		t.Fatalf("hold not clamped: held %d", q.Held())
	}
}
