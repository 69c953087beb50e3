package converge

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/fabric-mls/fabric/internal/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// outcomeNote is one outcome decision, kept in the checkpoint of the
// transaction that made it so a retry republishes the same record.
type outcomeNote struct {
	MessageID   []byte               `msgpack:"message_id"`
	Class       schema.InputClass    `msgpack:"class"`
	Status      schema.OutcomeStatus `msgpack:"status"`
	Category    schema.Category      `msgpack:"category,omitempty"`
	Disposition schema.Disposition   `msgpack:"disposition,omitempty"`
	Time        int64                `msgpack:"time_unix_ms"`
}

// accepted, deferred, stale and rejected build the notes of each
// disposition (Marmot foundation/errors.md vocabulary).
func accepted(id []byte, class schema.InputClass, at int64) outcomeNote {
	return outcomeNote{MessageID: id, Class: class, Status: schema.StatusQueued, Disposition: schema.DispositionAccepted, Time: at}
}

func deferredNote(id []byte, class schema.InputClass, cat schema.Category, at int64) outcomeNote {
	return outcomeNote{MessageID: id, Class: class, Status: schema.StatusQueued, Disposition: schema.DispositionDeferred, Category: cat, Time: at}
}

func staleNote(id []byte, class schema.InputClass, at int64) outcomeNote {
	return outcomeNote{MessageID: id, Class: class, Status: schema.StatusQueued, Disposition: schema.DispositionStale, Category: schema.CategoryStaleEpoch, Time: at}
}

func rejectedNote(id []byte, class schema.InputClass, cat schema.Category, at int64) outcomeNote {
	return outcomeNote{MessageID: id, Class: class, Status: schema.StatusRejected, Category: cat, Time: at}
}

// outcomes publishes outcome records on FABRIC_OUTCOMES.
type outcomes struct {
	js     jetstream.JetStream
	stream jetstream.Stream
}

// publish records n as the input's current outcome: one more revision than
// the record before it. The Nats-Msg-Id is derived from the decision, so a
// republish after a crash within the dedup window stores nothing new, and a
// republish after it finds the decision already current and stores nothing.
func (o *outcomes) publish(ctx context.Context, tenant string, n outcomeNote) error {
	idHex := hex.EncodeToString(n.MessageID)
	subj, err := subject.Outcome(tenant, idHex)
	if err != nil {
		return fmt.Errorf("outcome subject: %w", err)
	}
	var rev uint64
	last, err := o.stream.GetLastMsgForSubject(ctx, subj)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return fmt.Errorf("read outcome: %w", err)
	default:
		var prev schema.Outcome
		if err := prev.UnmarshalMsgpack(last.Data); err != nil {
			return fmt.Errorf("decode outcome: %w", err)
		}
		if prev.Status == n.Status && prev.Disposition == n.Disposition && prev.Category == n.Category {
			return nil
		}
		rev = prev.Revision
	}
	rec := schema.Outcome{
		MessageID:   n.MessageID,
		Class:       n.Class,
		Status:      n.Status,
		Category:    n.Category,
		Disposition: n.Disposition,
		Revision:    rev + 1,
		Time:        time.UnixMilli(n.Time).UTC(),
	}
	body, err := rec.MarshalMsgpack()
	if err != nil {
		return fmt.Errorf("encode outcome: %w", err)
	}
	m := nats.NewMsg(subj)
	m.Data = body
	m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("oc.%s.%s.%d", tenant, idHex, rec.Revision))
	if _, err := o.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("publish outcome: %w", err)
	}
	return nil
}
