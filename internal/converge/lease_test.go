package converge

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/streams"
)

// gatedKV holds each lease update until width of them are in flight at
// once, so renewals made one after another never get through.
type gatedKV struct {
	jetstream.KeyValue
	width    int32
	inFlight atomic.Int32
	open     chan struct{}
	opened   atomic.Bool
}

func (k *gatedKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	if k.inFlight.Add(1) >= k.width && k.opened.CompareAndSwap(false, true) {
		close(k.open)
	}
	select {
	case <-k.open:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return k.KeyValue.Update(ctx, key, value, last)
}

// TestLeasesRenewedTogether: a balance round renews a worker's leases side
// by side, not one after another, so a round on a slow store ends within
// the lease TTL instead of letting the last leases lapse while they are
// held (a partition owned by two workers for a moment).
func TestLeasesRenewedTogether(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	kv, err := e.js.KeyValue(e.ctx, streams.BucketConverge)
	if err != nil {
		t.Fatal(err)
	}
	var parts []int
	for p := range 16 {
		parts = append(parts, p)
	}
	l := newLeases(kv, "w", time.Minute, parts)
	for _, p := range parts {
		if ok, err := l.tryAcquire(e.ctx, p); err != nil || !ok {
			t.Fatalf("acquire %d: %v %v", p, ok, err)
		}
	}
	// Eight renewals must be in flight together before any completes.
	l.kv = &gatedKV{KeyValue: kv, width: 8, open: make(chan struct{})}
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	lost, err := l.renewAll(ctx, parts)
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	if len(lost) != 0 {
		t.Fatalf("lost %v", lost)
	}
	for _, p := range parts {
		got, err := kv.Get(e.ctx, leaseKey(p))
		if err != nil || got.Revision() != l.held[p] {
			t.Fatal(fmt.Errorf("lease %d not renewed to the revision held: %v", p, err))
		}
	}
}

// TestLeaseTakenByAnotherIsLostOnRenewal: a renewal finds the lease a
// second worker took and gives the partition up; the others stay held.
func TestLeaseTakenByAnotherIsLostOnRenewal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	kv, err := e.js.KeyValue(e.ctx, streams.BucketConverge)
	if err != nil {
		t.Fatal(err)
	}
	parts := []int{0, 1, 2}
	l := newLeases(kv, "w", time.Minute, parts)
	for _, p := range parts {
		if ok, err := l.tryAcquire(e.ctx, p); err != nil || !ok {
			t.Fatalf("acquire %d: %v %v", p, ok, err)
		}
	}
	// Another worker overwrites partition 1's lease (as after it lapsed).
	other := newLeases(kv, "other", time.Minute, parts)
	if _, err := kv.Put(e.ctx, leaseKey(1), other.record()); err != nil {
		t.Fatal(err)
	}
	lost, err := l.renewAll(e.ctx, parts)
	if err != nil {
		t.Fatal(err)
	}
	if len(lost) != 1 || lost[0] != 1 {
		t.Fatalf("lost %v, want [1]", lost)
	}
	if _, held := l.held[1]; held {
		t.Fatal("partition 1 still held")
	}
	for _, p := range []int{0, 2} {
		if _, held := l.held[p]; !held {
			t.Fatalf("partition %d no longer held", p)
		}
	}
}
