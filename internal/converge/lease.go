package converge

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"
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

	held map[int]uint64 // partition → revision of our lease record
	beat uint64         // revision of our heartbeat; 0 before the first
}

func newLeases(kv jetstream.KeyValue, worker string, ttl time.Duration) *leases {
	return &leases{kv: kv, worker: worker, ttl: ttl, now: time.Now, held: map[int]uint64{}}
}

func (l *leases) record() []byte {
	b, _ := msgpack.Marshal(leaseRecord{Worker: l.worker, Expires: l.now().Add(l.ttl).UnixMilli()})
	return b
}

func decodeLease(b []byte) (leaseRecord, error) {
	var r leaseRecord
	if err := msgpack.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decode lease: %w", err)
	}
	return r, nil
}

// heartbeat writes the worker's liveness record.
func (l *leases) heartbeat(ctx context.Context) error {
	rev, err := l.kv.Put(ctx, workerKey(l.worker), l.record())
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	l.beat = rev
	return nil
}

// liveWorkers counts workers whose heartbeat has not expired, this one
// included.
func (l *leases) liveWorkers(ctx context.Context) (int, error) {
	lister, err := l.kv.ListKeysFiltered(ctx, "WORKER.*")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return 1, nil
		}
		return 0, fmt.Errorf("list workers: %w", err)
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
		if err != nil || r.Expires < l.now().UnixMilli() {
			continue
		}
		if r.Worker == l.worker {
			self = true
		}
		n++
	}
	if !self {
		n++
	}
	return n, nil
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

// renew extends partition p's lease. It reports false when the lease was
// lost to another worker (the revision moved), in which case p is no
// longer held.
func (l *leases) renew(ctx context.Context, p int) (bool, error) {
	rev, ok := l.held[p]
	if !ok {
		return false, nil
	}
	nrev, err := l.kv.Update(ctx, leaseKey(p), l.record(), rev)
	if err != nil {
		if isConflict(err) || errors.Is(err, jetstream.ErrKeyNotFound) {
			delete(l.held, p)
			return false, nil
		}
		return true, fmt.Errorf("renew lease: %w", err)
	}
	l.held[p] = nrev
	return true, nil
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
