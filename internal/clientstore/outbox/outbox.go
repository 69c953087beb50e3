// Package outbox keeps a piece of client state in one JetStream KV key
// together with the events its changes still owe, and emits those events in
// the order the changes were stored.
//
// A change is a compare-and-set on the key: the new state and the events it
// causes are written in one KV update, so an event exists exactly when its
// change is stored (EVENT-010). The events are then published, each with its
// deterministic id as Nats-Msg-Id, and removed from the key. Every writer
// publishes the key's pending events from the oldest, so two writers of one
// key never emit its events out of order (EVENT-012, EVENT-057), and a
// change whose events were not published (a crash, a NATS outage) has them
// published by the next writer of the same key, with the same ids.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// maxAttempts bounds the compare-and-set retries of one call; writers of
// one key are few, so running out means something is wrong.
const maxAttempts = 64

// Errors a caller can branch on.
var (
	// ErrContention: the key changed under every attempt.
	ErrContention = errors.New("outbox: too much contention on one key")
	// ErrEmit: the change is stored but its events are not all published
	// yet; the next change of the key, or a retry, publishes them.
	ErrEmit = errors.New("outbox: change stored, events not yet emitted")
)

// Event is one event owed to one client's event subject.
type Event struct {
	Tenant   string `msgpack:"t"`
	ClientID string `msgpack:"c"`
	// ID is the event id, deterministic in what caused the event (EVENT-001).
	ID    string             `msgpack:"i"`
	Event schema.ClientEvent `msgpack:"e"`
}

// PublishFunc publishes one event to its client's subject with ID as
// Nats-Msg-Id. A duplicate id must not be an error.
type PublishFunc func(ctx context.Context, ev Event) error

// Change is what a mutation decides: the next state, whether to store it,
// and the events storing it causes, in emission order.
type Change[S any] struct {
	State  S
	Store  bool
	Events []Event
}

// Mutation computes a Change from the current state; found is false when
// the key holds nothing yet. It may run more than once (on conflicts) and
// must not have side effects.
type Mutation[S any] func(cur S, found bool) (Change[S], error)

// Outbox is a KV bucket and the publisher its events go to. It is safe for
// concurrent use.
type Outbox struct {
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	publish PublishFunc
}

// New returns an Outbox over kv, reached through js, that emits with
// publish.
func New(js jetstream.JetStream, kv jetstream.KeyValue, publish PublishFunc) *Outbox {
	return &Outbox{js: js, kv: kv, publish: publish}
}

type record[S any] struct {
	State   S       `msgpack:"s"`
	Pending []Event `msgpack:"p,omitempty"`
}

// Get reads the state at key; found is false when the key holds nothing.
// It reads from the bucket's leader: a read that follows an event sees
// the change the event reports on every instance (EVENT-010), where a
// direct get may be answered by a copy behind.
func Get[S any](ctx context.Context, o *Outbox, key string) (state S, found bool, err error) {
	rec, _, found, err := load[S](ctx, o, key, true)
	return rec.State, found, err
}

// load reads key, from the bucket's leader when leader is set (bus.KVGetLeader),
// else with the KV client's direct get, which any copy may answer: a
// compare-and-set that a copy behind made fail reads from the leader when
// it tries again.
func load[S any](ctx context.Context, o *Outbox, key string, leader bool) (record[S], uint64, bool, error) {
	var rec record[S]
	b, rev, found, err := o.read(ctx, key, leader)
	if err != nil || !found {
		return rec, 0, false, err
	}
	if err := decodeRecord(b, &rec); err != nil {
		return rec, 0, false, err
	}
	return rec, rev, true, nil
}

// read is one read of key, as load.
func (o *Outbox) read(ctx context.Context, key string, leader bool) ([]byte, uint64, bool, error) {
	if leader {
		b, rev, found, err := bus.KVGetLeader(ctx, o.js, o.kv.Bucket(), key)
		if err != nil {
			return nil, 0, false, fmt.Errorf("outbox: get: %w", err)
		}
		return b, rev, found, nil
	}
	e, err := o.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, fmt.Errorf("outbox: get: %w", err)
	}
	return e.Value(), e.Revision(), true, nil
}

// decodeRecord decodes a stored record into rec.
func decodeRecord(b []byte, rec any) error {
	if err := schema.UnmarshalMsgpack(b, rec); err != nil {
		return fmt.Errorf("outbox: decode record: %w", err)
	}
	return nil
}

// Apply runs m on the state at key and stores its change together with the
// change's events, then publishes every event the key owes, oldest first.
// It returns the state after the call and the events this change caused.
// An error from m is returned as is, with nothing stored. ErrEmit means the
// change is stored and its events will follow.
func Apply[S any](ctx context.Context, o *Outbox, key string, m Mutation[S]) (S, []Event, error) {
	for attempt := 0; attempt < maxAttempts; attempt++ {
		rec, rev, found, err := load[S](ctx, o, key, attempt > 0)
		if err != nil {
			var zero S
			return zero, nil, err
		}
		ch, err := m(rec.State, found)
		if err != nil {
			return rec.State, nil, err
		}
		if !ch.Store {
			// Nothing changes; still pay what an earlier change owes.
			if len(rec.Pending) > 0 {
				if err := o.flush(ctx, key, rec.Pending); err != nil {
					return rec.State, nil, err
				}
			}
			return rec.State, nil, nil
		}
		rec.State = ch.State
		rec.Pending = append(rec.Pending, ch.Events...)
		ok, err := o.write(ctx, key, rev, found, rec)
		if err != nil {
			return rec.State, nil, err
		}
		if !ok {
			backoff(ctx, attempt)
			continue
		}
		if len(rec.Pending) > 0 {
			if err := o.flush(ctx, key, rec.Pending); err != nil {
				return rec.State, ch.Events, err
			}
		}
		return rec.State, ch.Events, nil
	}
	var zero S
	return zero, nil, ErrContention
}

// Flush publishes whatever key still owes. It is what a restarted process
// calls for a key it knows may hold pending events.
func Flush[S any](ctx context.Context, o *Outbox, key string) error {
	rec, _, found, err := load[S](ctx, o, key, true)
	if err != nil || !found || len(rec.Pending) == 0 {
		return err
	}
	return o.flush(ctx, key, rec.Pending)
}

// write stores rec at key if the key is still at rev. ok is false on a
// conflict.
func (o *Outbox) write(ctx context.Context, key string, rev uint64, found bool, rec any) (ok bool, err error) {
	b, err := msgpack.Marshal(rec)
	if err != nil {
		return false, fmt.Errorf("outbox: encode record: %w", err)
	}
	if found {
		_, err = o.kv.Update(ctx, key, b, rev)
	} else {
		_, err = o.kv.Create(ctx, key, b)
	}
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
		return false, nil
	}
	return false, fmt.Errorf("outbox: store: %w", err)
}

// flush publishes pending in order, stopping at the first failure, then
// drops what it published from the key.
func (o *Outbox) flush(ctx context.Context, key string, pending []Event) error {
	done := make(map[string]bool, len(pending))
	var pubErr error
	for _, ev := range pending {
		err := o.publish(ctx, ev)
		var invalid *bus.InvalidEventError
		if errors.As(err, &invalid) {
			// It can never be published; keeping it would block the key.
			done[ev.ID] = true
			pubErr = fmt.Errorf("outbox: dropped an event that cannot be published: %w", err)
			continue
		}
		if err != nil {
			pubErr = errors.Join(pubErr, fmt.Errorf("%w: %w", ErrEmit, err))
			break
		}
		done[ev.ID] = true
	}
	if len(done) > 0 {
		if err := o.drop(ctx, key, done); err != nil {
			return errors.Join(pubErr, err)
		}
	}
	return pubErr
}

// drop removes the leading pending events whose ids are in done. Events a
// concurrent writer appended meanwhile stay.
func (o *Outbox) drop(ctx context.Context, key string, done map[string]bool) error {
	for attempt := 0; attempt < maxAttempts; attempt++ {
		var rec record[msgpack.RawMessage]
		b, rev, found, err := o.read(ctx, key, attempt > 0)
		if err == nil && !found && attempt == 0 {
			continue // a copy behind: ask the leader
		}
		if err == nil && !found {
			err = jetstream.ErrKeyNotFound
		}
		if err != nil {
			return fmt.Errorf("outbox: get: %w", err)
		}
		if err := decodeRecord(b, &rec); err != nil {
			return err
		}
		n := 0
		for n < len(rec.Pending) && done[rec.Pending[n].ID] {
			n++
		}
		if n == 0 {
			return nil
		}
		rec.Pending = rec.Pending[n:]
		ok, err := o.write(ctx, key, rev, true, rec)
		if err != nil || ok {
			return err
		}
		backoff(ctx, attempt)
	}
	return ErrContention
}

// backoff waits a little before a retry, more after repeated conflicts, so
// writers of one key stop colliding.
func backoff(ctx context.Context, attempt int) {
	if attempt == 0 {
		return
	}
	d := time.Duration(rand.IntN(1<<min(attempt, 6))) * time.Millisecond
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Decode decodes the state of a stored record, as Get reads it.
func Decode[S any](b []byte) (S, error) {
	var rec record[S]
	err := decodeRecord(b, &rec)
	return rec.State, err
}
