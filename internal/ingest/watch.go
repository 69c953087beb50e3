package ingest

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// retryKey names the retained objects of one group for one reason.
type retryKey struct {
	tenant, group, reason string
}

// retrier collects groups whose retained objects should be offered again
// and hands them to one goroutine; a group scheduled twice before its turn
// is retried once.
type retrier struct {
	mu      sync.Mutex
	pending map[retryKey]struct{}
	wake    chan struct{}
}

func newRetrier() *retrier {
	return &retrier{pending: map[retryKey]struct{}{}, wake: make(chan struct{}, 1)}
}

func (r *retrier) schedule(k retryKey) {
	r.mu.Lock()
	r.pending[k] = struct{}{}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *retrier) take() []retryKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	ks := make([]retryKey, 0, len(r.pending))
	for k := range r.pending {
		ks = append(ks, k)
	}
	clear(r.pending)
	return ks
}

// retryBackoff is how long a retry that failed (NATS unavailable, say)
// waits before it runs again.
const retryBackoff = time.Second

// runRetries offers retained objects again until ctx ends. A retry that
// fails is scheduled again after retryBackoff, so a transient failure does
// not leave objects waiting for the group's next change.
func (s *Service) runRetries(ctx context.Context) {
	backoff := time.NewTimer(retryBackoff)
	backoff.Stop()
	defer backoff.Stop()
	var failed []retryKey
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.retry.wake:
		case <-backoff.C:
			for _, k := range failed {
				s.retry.schedule(k)
			}
			failed = nil
			continue
		}
		for _, k := range s.retry.take() {
			if err := s.retryKey(ctx, k); err != nil && ctx.Err() == nil {
				s.log.Warn("retrying retained objects", "reason", k.reason, "err", err)
				if len(failed) == 0 {
					backoff.Reset(retryBackoff)
				}
				failed = append(failed, k)
			}
		}
	}
}

// watchKV applies every entry of a bucket to the directory, then each
// change, until ctx ends. It closes ready once the initial values are in.
func (s *Service) watchKV(ctx context.Context, w jetstream.KeyWatcher, apply func(tenant, group string, e jetstream.KeyValueEntry, initial bool), ready chan<- struct{}) {
	defer func() {
		_ = w.Stop()
		if ctx.Err() == nil {
			// The cache would go stale: stop claiming readiness.
			s.watchLost.Store(true)
			s.log.Error("KV watch ended; worker not ready")
		}
	}()
	initial := true
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				initial = false
				close(ready)
				continue
			}
			tenant, parts, err := subject.ParseKey(e.Key())
			if err != nil || len(parts) != 1 || subject.ValidGroup(parts[0]) != nil {
				continue
			}
			apply(tenant, parts[0], e, initial)
		}
	}
}

// applyGroupKeys records a group's candidate keys and retries its
// transport-deferred objects: the decryption context changed.
func (s *Service) applyGroupKeys(tenant, group string, e jetstream.KeyValueEntry, initial bool) {
	if e.Operation() != jetstream.KeyValuePut {
		s.dir.setKeys(e.Key(), nil)
		return
	}
	keys, err := bus.OpenGroupKeys(s.cfg.Vault, e.Value())
	if err != nil {
		s.log.Error("ignoring group key set", "key", e.Key(), "err", err)
		return
	}
	s.dir.setKeys(e.Key(), keys)
	if !initial {
		s.retry.schedule(retryKey{tenant: tenant, group: group, reason: reasonDeferred})
	}
}

// applyGroup records whether a hosted client holds a group; when one does,
// the group's unknown-group objects are offered to convergence (late
// welcome backfill). A group that becomes known is marked for the
// backfill until it ran, so its later input waits for it.
func (s *Service) applyGroup(tenant, group string, e jetstream.KeyValueEntry, initial bool) {
	known := e.Operation() == jetstream.KeyValuePut && s.hasMembers(e.Value())
	s.dir.setKnown(e.Key(), known, e.Revision(), !initial)
	if known && !initial {
		s.retry.schedule(retryKey{tenant: tenant, group: group, reason: reasonUnknown})
		// A sealed object that opened while the group was unknown is
		// still retained as transport-deferred.
		s.retry.schedule(retryKey{tenant: tenant, group: group, reason: reasonDeferred})
	}
}

// sweepRetained schedules a retry of every retained group whose state
// could have changed while no worker watched: run once at start. A known
// group with unknown-group objects is marked for a backfill, so its input
// waits for them.
func (s *Service) sweepRetained(ctx context.Context) error {
	info, err := s.retainedStream.Info(ctx, jetstream.WithSubjectFilter(subject.RetainedPattern))
	if err != nil {
		return err
	}
	for subj := range info.State.Subjects {
		tenant, group, reason, err := subject.ParseRetained(subj)
		if err != nil {
			continue
		}
		if key, err := subject.GroupKey(tenant, group); err == nil && reason == reasonUnknown {
			s.dir.markBackfill(key)
		}
		s.retry.schedule(retryKey{tenant: tenant, group: group, reason: reason})
	}
	return nil
}

// hasMembers reports whether a fabric-groups value names a hosted member.
// A value ingest cannot read counts as hosted: converge is the authority on
// the group, and input it gets is better than input held back for good.
func (s *Service) hasMembers(v []byte) bool {
	var g bus.GroupRecord
	if err := schema.UnmarshalMsgpack(v, &g); err != nil {
		s.log.Warn("unreadable fabric-groups record; group treated as hosted", "err", err)
		return len(v) > 0
	}
	return len(g.Members) > 0
}
