package converge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// A lease says which worker owns a partition until when. Leases and worker
// heartbeats live in the KV bucket fabric-converge under
//
//	LEASE.<partition>  → leaseRecord (msgpack)
//	WORKER.<worker_id> → leaseRecord of the worker's heartbeat
//
// and change only by compare-and-set on the key's revision, so two workers
// can never both believe a write of theirs made them owner. A lease is not a
// lock, though: a paused owner keeps believing it owns the partition until
// it looks again. Correctness comes from the per-group checkpoint fence
// (see fence.go); the lease only keeps two workers from doing the same work.
type leaseRecord struct {
	Worker  string `msgpack:"worker"`
	Expires int64  `msgpack:"expires_unix_ms"`
	// Partitions, on a heartbeat, are the partitions the worker may own.
	Partitions []int `msgpack:"partitions,omitempty"`
}

// leaseKey is the KV key of partition p's lease.
func leaseKey(p int) string { return "LEASE." + strconv.Itoa(p) }

// workerKey is the KV key of a worker's heartbeat.
func workerKey(id string) string { return "WORKER." + id }

// leases manages one worker's partition leases. It is used by one goroutine
// (the worker's balance loop).
type leases struct {
	kv     jetstream.KeyValue
	worker string
	ttl    time.Duration
	now    func() time.Time

	held  map[int]uint64 // partition → revision of our lease record
	beat  uint64         // revision of our heartbeat; 0 before the first
	parts []int          // the partitions this worker may own
}

func newLeases(kv jetstream.KeyValue, worker string, ttl time.Duration, parts []int) *leases {
	return &leases{kv: kv, worker: worker, ttl: ttl, now: time.Now, held: map[int]uint64{}, parts: parts}
}

func (l *leases) record() []byte {
	b, _ := msgpack.Marshal(leaseRecord{Worker: l.worker, Expires: l.now().Add(l.ttl).UnixMilli()})
	return b
}

func decodeLease(b []byte) (leaseRecord, error) {
	var r leaseRecord
	if err := schema.UnmarshalMsgpack(b, &r); err != nil {
		return r, fmt.Errorf("decode lease: %w", err)
	}
	return r, nil
}

// heartbeat writes the worker's liveness record, with its partitions.
func (l *leases) heartbeat(ctx context.Context) error {
	b, err := msgpack.Marshal(leaseRecord{Worker: l.worker, Expires: l.now().Add(l.ttl).UnixMilli(), Partitions: l.parts})
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	rev, err := l.kv.Put(ctx, workerKey(l.worker), b)
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	l.beat = rev
	return nil
}

// liveWorkers counts the workers whose heartbeat has not expired and that
// may own one of this worker's partitions, this one included, and returns
// which of its partitions another live worker may own too.
func (l *leases) liveWorkers(ctx context.Context) (int, map[int]bool, error) {
	contested := map[int]bool{}
	lister, err := l.kv.ListKeysFiltered(ctx, "WORKER.*")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return 1, contested, nil
		}
		return 0, nil, fmt.Errorf("list workers: %w", err)
	}
	defer lister.Stop()
	n := 0
	self := false
	for key := range lister.Keys() {
		e, err := l.kv.Get(ctx, key)
		if err != nil {
			continue
		}
		r, err := decodeLease(e.Value())
		if err != nil || r.Expires < l.now().UnixMilli() || !l.overlaps(r.Partitions) {
			continue
		}
		if r.Worker == l.worker {
			self = true
		} else {
			for _, p := range l.parts {
				if len(r.Partitions) == 0 || slices.Contains(r.Partitions, p) {
					contested[p] = true
				}
			}
		}
		n++
	}
	if !self {
		n++
	}
	return n, contested, nil
}

// overlaps reports whether a worker with partitions ps competes with this
// one; a record without partitions may own any.
func (l *leases) overlaps(ps []int) bool {
	if len(ps) == 0 {
		return true
	}
	for _, p := range ps {
		if slices.Contains(l.parts, p) {
			return true
		}
	}
	return false
}

// free reports whether partition p's lease is absent or expired.
func (l *leases) free(ctx context.Context, p int) (bool, error) {
	e, err := l.kv.Get(ctx, leaseKey(p))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("read lease: %w", err)
	}
	r, err := decodeLease(e.Value())
	return err != nil || r.Expires < l.now().UnixMilli(), nil
}

// tryAcquire takes partition p if its lease is absent or expired. It
// reports whether this worker now holds it.
func (l *leases) tryAcquire(ctx context.Context, p int) (bool, error) {
	e, err := l.kv.Get(ctx, leaseKey(p))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		rev, err := l.kv.Create(ctx, leaseKey(p), l.record())
		if err != nil {
			if isConflict(err) {
				return false, nil
			}
			return false, fmt.Errorf("create lease: %w", err)
		}
		l.held[p] = rev
		return true, nil
	case err != nil:
		return false, fmt.Errorf("read lease: %w", err)
	}
	r, err := decodeLease(e.Value())
	if err == nil && r.Worker != l.worker && r.Expires >= l.now().UnixMilli() {
		return false, nil
	}
	rev, err := l.kv.Update(ctx, leaseKey(p), l.record(), e.Revision())
	if err != nil {
		if isConflict(err) {
			return false, nil
		}
		return false, fmt.Errorf("take lease: %w", err)
	}
	l.held[p] = rev
	return true, nil
}

// renewAtOnce bounds the lease renewals in flight at once: a round renews
// up to 64 leases, and one after another on a slow store (a starved
// machine, a cluster electing) it could outlast the TTL, letting the last
// leases lapse while they are held.
const renewAtOnce = 8

// renewAll extends the leases of ps, up to renewAtOnce at a time. It
// returns the partitions whose lease was lost to another worker (the
// revision moved, or the key is gone); those are no longer held. An error
// other than a lost lease is returned after every renewal has ended, and
// leaves the lease held: the next round tries again.
func (l *leases) renewAll(ctx context.Context, ps []int) (lost []int, err error) {
	type renewal struct {
		rev  uint64
		held bool
		err  error
	}
	results := make([]renewal, len(ps))
	sem := make(chan struct{}, renewAtOnce)
	var wg sync.WaitGroup
	for i, p := range ps {
		rev, ok := l.held[p]
		results[i] = renewal{held: ok}
		if !ok {
			continue
		}
		b := l.record()
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			results[i].rev, results[i].err = l.kv.Update(ctx, leaseKey(p), b, rev)
		})
	}
	wg.Wait()
	var errs []error
	for i, r := range results {
		p := ps[i]
		switch {
		case !r.held, r.err != nil && (isConflict(r.err) || errors.Is(r.err, jetstream.ErrKeyNotFound)):
			delete(l.held, p)
			lost = append(lost, p)
		case r.err != nil:
			errs = append(errs, fmt.Errorf("renew lease %d: %w", p, r.err))
		default:
			l.held[p] = r.rev
		}
	}
	return lost, errors.Join(errs...)
}

// release gives partition p up so another worker can take it at once.
func (l *leases) release(ctx context.Context, p int) error {
	rev, ok := l.held[p]
	if !ok {
		return nil
	}
	delete(l.held, p)
	if err := l.kv.Delete(ctx, leaseKey(p), jetstream.LastRevision(rev)); err != nil && !isConflict(err) {
		return fmt.Errorf("release lease: %w", err)
	}
	return nil
}

// retire deletes the worker's heartbeat, so others rebalance without
// waiting for it to expire.
func (l *leases) retire(ctx context.Context) error {
	if err := l.kv.Delete(ctx, workerKey(l.worker)); err != nil {
		return fmt.Errorf("retire worker: %w", err)
	}
	return nil
}

// isConflict reports a compare-and-set conflict: wrong last sequence
// (10071) or another write in flight on the subject (10164, clustered).
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == 10164
	}
	return false
}
