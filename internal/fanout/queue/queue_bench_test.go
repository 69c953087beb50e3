package queue

import "testing"

type event struct{ _ []byte }

func eventSeq(*event) uint64 { return 0 }

// BenchmarkPushPopCredit measures one event through the queue at steady
// state: accepted, handed off and credited back.
func BenchmarkPushPopCredit(b *testing.B) {
	q := New[*event](DefaultCapacity, eventSeq)
	ev := &event{}
	b.ReportAllocs()
	for b.Loop() {
		q.Push(ev)
		q.Pop()
		_ = q.Credit(1)
	}
}

// BenchmarkPushBurst fills the queue to its bound and drains it, as a burst
// to one subscription does.
func BenchmarkPushBurst(b *testing.B) {
	q := New[*event](DefaultCapacity, eventSeq)
	ev := &event{}
	b.ReportAllocs()
	for b.Loop() {
		for range DefaultCapacity {
			q.Push(ev)
		}
		for {
			if _, ok := q.Pop(); !ok {
				break
			}
		}
		_ = q.Credit(DefaultCapacity)
	}
}

// BenchmarkPushDiscard measures the cost of a discard at the bound.
func BenchmarkPushDiscard(b *testing.B) {
	q := New[*event](DefaultCapacity, eventSeq)
	ev := &event{}
	for range DefaultCapacity {
		q.Push(ev)
	}
	b.ReportAllocs()
	for b.Loop() {
		q.Push(ev)
	}
}
