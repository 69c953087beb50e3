package converge

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// outcomeNote is one outcome decision, kept in the checkpoint of the
// transaction that made it so a retry republishes the same record.
type outcomeNote struct {
	MessageID   []byte               `msgpack:"message_id"`
	Class       schema.InputClass    `msgpack:"class"`
	Status      schema.OutcomeStatus `msgpack:"status"`
	Category    schema.Category      `msgpack:"category,omitempty"`
	Disposition schema.Disposition   `msgpack:"disposition,omitempty"`
	// Named is a named convergence outcome (BeyondAnchor,
	// MissingRetainedAnchor) under branch selection.
	Named schema.NamedOutcome `msgpack:"named,omitempty"`
	Time  int64               `msgpack:"time_unix_ms"`
	// Reason says why beside the category, where converge knows
	// (schema.Outcome.Reason).
	Reason string `msgpack:"reason,omitempty"`
}

// accepted and rejectedNote build the notes of the dispositions converge
// decides itself (Marmot foundation/errors.md vocabulary).
func accepted(id []byte, class schema.InputClass, at int64) outcomeNote {
	return outcomeNote{MessageID: id, Class: class, Status: schema.StatusQueued, Disposition: schema.DispositionAccepted, Time: at}
}

func rejectedNote(id []byte, class schema.InputClass, cat schema.Category, at int64) outcomeNote {
	return outcomeNote{MessageID: id, Class: class, Status: schema.StatusRejected, Category: cat, Time: at}
}

// outcomes publishes outcome records on FABRIC_OUTCOMES.
type outcomes struct {
	js jetstream.JetStream
}

// outcomeWrites are outcome records sent and not yet acknowledged.
type outcomeWrites struct {
	futures []jetstream.PubAckFuture
}

// start records each note as its input's current outcome: one more
// revision than the record before it. The records before them are read in
// one batched direct get, and every write is sent without waiting (await
// collects the acknowledgements), so a transaction of many inputs pays
// about two round trips, not two per input. The Nats-Msg-Id is derived
// from the decision, so a republish after a crash within the dedup window
// stores nothing new, and a republish after it finds the decision already
// current and stores nothing.
func (o *outcomes) start(ctx context.Context, tenant string, notes []outcomeNote) (*outcomeWrites, error) {
	ow := &outcomeWrites{}
	if len(notes) == 0 {
		return ow, nil
	}
	subjects := make([]string, len(notes))
	for i, n := range notes {
		subj, err := subject.Outcome(tenant, hex.EncodeToString(n.MessageID))
		if err != nil {
			return nil, fmt.Errorf("outcome subject: %w", err)
		}
		subjects[i] = subj
	}
	prev, err := o.last(ctx, subjects)
	if err != nil {
		return nil, err
	}
	for i, n := range notes {
		p := prev[subjects[i]]
		if p != nil && p.Status == n.Status && p.Disposition == n.Disposition && p.Category == n.Category && p.NamedOutcome == n.Named {
			continue
		}
		if p != nil && refusesRoutingOfApplied(p, n) {
			continue
		}
		// Without a record the stored input is the first one (ingest
		// answers it as queued, revision 1).
		rev := uint64(1)
		if p != nil {
			rev = p.Revision
		}
		rec := &schema.Outcome{
			MessageID:    n.MessageID,
			Class:        n.Class,
			Status:       n.Status,
			Category:     n.Category,
			Disposition:  n.Disposition,
			NamedOutcome: n.Named,
			Reason:       n.Reason,
			Revision:     rev + 1,
			Time:         time.UnixMilli(n.Time).UTC(),
		}
		body, err := rec.MarshalMsgpack()
		if err != nil {
			return nil, fmt.Errorf("encode outcome: %w", err)
		}
		m := nats.NewMsg(subjects[i])
		m.Data = body
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("oc.%s.%s.%d", tenant, hex.EncodeToString(n.MessageID), rec.Revision))
		f, err := o.js.PublishMsgAsync(m)
		if err != nil {
			return nil, fmt.Errorf("publish outcome: %w", err)
		}
		ow.futures = append(ow.futures, f)
		// A later note of the same input (deferred, then released in the
		// same transaction) goes on top of this one: one connection keeps
		// their order.
		prev[subjects[i]] = rec
	}
	return ow, nil
}

// refusesRoutingOfApplied reports a wrong_recipient decision about one copy
// of a message (a Welcome posted with another group as its hint) after
// another copy of the same bytes was applied: the refusal is about the
// copy's routing, and must not hide the applied decision under the same
// message id (docs/ingest.md, "Routing").
func refusesRoutingOfApplied(p *schema.Outcome, n outcomeNote) bool {
	return n.Category == schema.CategoryWrongRecipient && p.Status == schema.StatusQueued && p.Disposition == schema.DispositionAccepted
}

// await waits for every record start sent.
func (ow *outcomeWrites) await(ctx context.Context) error {
	var first error
	for _, f := range ow.futures {
		if err := awaitAck(ctx, f); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if first == nil {
				first = fmt.Errorf("publish outcome: %w", err)
			}
		}
	}
	return first
}

// ackWait bounds the wait for one asynchronous write's acknowledgement.
// The client sets none, and an acknowledgement lost with a NATS node
// (stored or not) would hold the partition for ever; the input fails
// instead and is retried in order, and its writes are idempotent.
var ackWait = 10 * time.Second

// errAckTimeout reports a write whose acknowledgement did not come within
// ackWait.
var errAckTimeout = errors.New("converge: no acknowledgement within the ack wait")

// awaitAck waits for f's acknowledgement: nil, the write's error,
// errAckTimeout, or ctx's error.
func awaitAck(ctx context.Context, f jetstream.PubAckFuture) error {
	t := time.NewTimer(ackWait)
	defer t.Stop()
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	case <-t.C:
		return errAckTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}

// last returns the newest outcome record of each subject that has one.
func (o *outcomes) last(ctx context.Context, subjects []string) (map[string]*schema.Outcome, error) {
	msgs, err := bus.LastMsgs(ctx, o.js, streams.StreamOutcomes, subjects)
	if err != nil {
		return nil, fmt.Errorf("read outcomes: %w", err)
	}
	out := make(map[string]*schema.Outcome, len(msgs))
	for subj, m := range msgs {
		var rec schema.Outcome
		if err := rec.UnmarshalMsgpack(m.Data); err != nil {
			return nil, fmt.Errorf("decode outcome: %w", err)
		}
		out[subj] = &rec
	}
	return out, nil
}
