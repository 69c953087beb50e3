package signals

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Bounds of a stream report.
const (
	// MaxStreamID bounds a stream id's length.
	MaxStreamID = 128
	// MaxStreams bounds the open streams the fabric holds for one client.
	MaxStreams = 64
)

// StreamReport is the body of POST …/connection: the state one of the
// client's app streams that hold network interest is in now. closed ends
// the stream.
type StreamReport struct {
	StreamID string                 `json:"stream_id" msgpack:"stream_id"`
	State    schema.ConnectionState `json:"state" msgpack:"state"`
}

// check validates a report: a stream id of 1 to MaxStreamID visible ASCII
// characters and one of PROC section 6's states.
func (r StreamReport) check() error {
	if r.StreamID == "" || len(r.StreamID) > MaxStreamID {
		return refusal.BadRequest("stream_id: 1 to %d characters", MaxStreamID)
	}
	for i := 0; i < len(r.StreamID); i++ {
		if c := r.StreamID[i]; c < 0x21 || c > 0x7e {
			return refusal.BadRequest("stream_id: visible ASCII only")
		}
	}
	if !r.State.Valid() {
		return refusal.BadRequest("state: want connecting, connected, reconnecting, failed or closed")
	}
	return nil
}

// aggregate is the client's connection state over its open streams
// (EVENT-027): failed if any is failed, else reconnecting if any is, else
// connecting if any is, else connected; closed when none is open.
func aggregate(streams map[string]schema.ConnectionState) schema.ConnectionState {
	if len(streams) == 0 {
		return schema.ConnectionClosed
	}
	for _, st := range []schema.ConnectionState{schema.ConnectionFailed, schema.ConnectionReconnecting, schema.ConnectionConnecting} {
		for _, s := range streams {
			if s == st {
				return st
			}
		}
	}
	return schema.ConnectionConnected
}

func (s *Service) serveConnection(w http.ResponseWriter, r *http.Request) {
	ans, replayed, err := s.handleConnection(r)
	s.answer(w, r, schema.KindConnectionStateChanged, ans, replayed, err)
}

func (s *Service) handleConnection(r *http.Request) (Answer, bool, error) {
	ctx := r.Context()
	t, err := clientstore.Authorize(r, s.verify, auth.ScopeSignals)
	if err != nil {
		return Answer{}, false, err
	}
	key := r.Header.Get(IdempotencyHeader)
	if err := checkIdempotencyKey(key); err != nil {
		return Answer{}, false, err
	}
	var rep StreamReport
	if err := httpapi.Decode(r, maxBody, &rep); err != nil {
		return Answer{}, false, err
	}
	client, err := s.lookup(ctx, t)
	if err != nil {
		return Answer{}, false, err
	}
	return s.ReportStream(ctx, client, key, rep)
}

// ReportStream stores the state of one of client's streams under an
// idempotency key and emits connection.state_changed when the client's
// aggregate state changes, with the aggregate it held as previous; no
// change emits nothing (EVENT-027). The answer carries the aggregate.
func (s *Service) ReportStream(ctx context.Context, client clientstore.Record, key string, rep StreamReport) (Answer, bool, error) {
	if err := rep.check(); err != nil {
		return Answer{}, false, err
	}
	// A domain label keeps a report's digest apart from an event's.
	body, err := msgpack.Marshal([]any{"stream", rep.StreamID, rep.State})
	if err != nil {
		return Answer{}, false, fmt.Errorf("signals: encode: %w", err)
	}
	return s.once(ctx, client, key, body, func(keyDigest string) (Answer, bool, error) {
		return s.applyStream(ctx, client, keyDigest, rep)
	})
}

// applyStream updates the client's open streams in its client-wide ordering
// record, which serializes every report of the client, and emits the
// aggregate's change.
func (s *Service) applyStream(ctx context.Context, client clientstore.Record, keyDigest string, rep StreamReport) (Answer, bool, error) {
	okey, err := subject.Key(client.Tenant, client.ClientID, "signals", "client")
	if err != nil {
		return Answer{}, false, fmt.Errorf("signals: order key: %w", err)
	}
	var ans Answer
	var replayed bool
	_, _, err = outbox.Apply(ctx, s.out, okey, func(cur orderState, _ bool) (outbox.Change[orderState], error) {
		ans, replayed = Answer{}, false
		if r, ok := cur.replay(keyDigest); ok {
			ans, replayed = r, true
			return outbox.Change[orderState]{State: cur}, nil
		}
		held := cur.Connection
		if held == "" {
			held = schema.ConnectionClosed
		}
		next := cur
		next.Streams = maps.Clone(cur.Streams)
		if rep.State == schema.ConnectionClosed {
			delete(next.Streams, rep.StreamID)
		} else {
			if _, open := next.Streams[rep.StreamID]; !open && len(next.Streams) >= MaxStreams {
				return outbox.Change[orderState]{}, ErrTooManyStreams.With("the client has %d open streams; close one first", MaxStreams)
			}
			if next.Streams == nil {
				next.Streams = make(map[string]schema.ConnectionState)
			}
			next.Streams[rep.StreamID] = rep.State
		}
		now := aggregate(next.Streams)
		next.Connection = now
		var events []outbox.Event
		if now != held {
			events = append(events, outbox.Event{Tenant: client.Tenant, ClientID: client.ClientID,
				ID: outbox.ID(client.Tenant, client.ClientID, "signal", keyDigest, client.ClientID),
				Event: schema.ClientEvent{Kind: schema.KindConnectionStateChanged,
					ConnectionStateChanged: &schema.ConnectionStateChanged{Previous: held, Current: now}}})
		}
		ans = Answer{Emitted: len(events), Connection: now}
		next.remember(keyDigest, ans)
		return outbox.Change[orderState]{State: next, Store: true, Events: events}, nil
	})
	return ans, replayed, err
}

// replay returns the answer of a key the record applied lately.
func (o orderState) replay(keyDigest string) (Answer, bool) {
	for _, r := range o.Recent {
		if r.Key == keyDigest {
			return Answer{Emitted: r.Emitted, Connection: r.Connection}, true
		}
	}
	return Answer{}, false
}

// remember records a key's answer, keeping the newest recentKeys.
func (o *orderState) remember(keyDigest string, ans Answer) {
	o.Recent = append(slices.Clone(o.Recent), recent{Key: keyDigest, Emitted: ans.Emitted, Connection: ans.Connection})
	if len(o.Recent) > recentKeys {
		o.Recent = o.Recent[len(o.Recent)-recentKeys:]
	}
}
