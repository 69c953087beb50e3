package ingest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// casAttempts bounds the retries of an outcome write that keeps meeting a
// concurrent writer.
const casAttempts = 4

// latest is the newest outcome record of an input and its stream sequence.
type latest struct {
	rec schema.Outcome
	seq uint64
}

// readOutcome returns the newest outcome record on subj, or nil when there
// is none.
func (s *Service) readOutcome(ctx context.Context, subj string) (*latest, error) {
	m, err := bus.GetMsg(ctx, s.js, streamOutcomes, bus.MsgRequest{LastBySubject: subj})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read outcome: %w", err)
	}
	var rec schema.Outcome
	if err := rec.UnmarshalMsgpack(m.Data); err != nil {
		return nil, fmt.Errorf("decode outcome: %w", err)
	}
	return &latest{rec: rec, seq: m.Sequence}, nil
}

// queuedFrom is the outcome an admitted input has until converge writes a
// record: queued, revision 1 (the input is the first record), at the time
// the input was stored.
func queuedFrom(idHex string, in *bus.StoredMsg) schema.Outcome {
	// idHex is a checked message id.
	id, _ := hex.DecodeString(idHex)
	return schema.Outcome{
		MessageID: id,
		Class:     schema.InputClass(in.Header.Get(bus.HeaderClass)),
		Status:    schema.StatusQueued,
		Revision:  1,
		Time:      in.Time.UTC(),
	}
}

// sameOutcome reports whether a record already says what rec says.
func sameOutcome(a, b schema.Outcome) bool {
	return a.Status == b.Status && a.Category == b.Category && a.Disposition == b.Disposition && a.Class == b.Class
}

// outcomeMsg builds the record message. Every write is a compare-and-set
// on the input's subject (Nats-Expected-Last-Subject-Sequence: the record
// it follows, 0 for the first), so revisions never fork and a retried write
// is stored at most once. It carries no Nats-Msg-Id: converge names its own
// records oc.<tenant>.<id>.<revision>, and an ingest record under the same
// id would make the server drop converge's decision as a duplicate when
// both write the same revision (converge reads, ingest writes, converge
// writes).
func outcomeMsg(tenant string, rec schema.Outcome, expect uint64) (*nats.Msg, error) {
	idHex := hex.EncodeToString(rec.MessageID)
	subj, err := subject.Outcome(tenant, idHex)
	if err != nil {
		return nil, fmt.Errorf("outcome subject: %w", err)
	}
	body, err := rec.MarshalMsgpack()
	if err != nil {
		return nil, fmt.Errorf("encode outcome: %w", err)
	}
	m := nats.NewMsg(subj)
	m.Data = body
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	return m, nil
}

// readOutcomes returns the newest outcome record of each input by its
// message id, in one batched direct get; an input without a record has
// none in the map. A replica may answer, and may lag the leader by what
// was just written: a record it misses is caught by the JetStream window
// (the input's Nats-Msg-Id) or by the compare-and-set of the record write.
func (s *Service) readOutcomes(ctx context.Context, tenant string, ins []*input) (map[[32]byte]*latest, error) {
	subjects := make([]string, len(ins))
	for i, in := range ins {
		subj, err := subject.Outcome(tenant, in.hexID())
		if err != nil {
			return nil, fmt.Errorf("outcome subject: %w", err)
		}
		subjects[i] = subj
	}
	msgs, err := bus.LastMsgs(ctx, s.js, streamOutcomes, subjects)
	if err != nil {
		return nil, fmt.Errorf("read outcomes: %w", err)
	}
	out := make(map[[32]byte]*latest, len(msgs))
	for i, in := range ins {
		m := msgs[subjects[i]]
		if m == nil {
			continue
		}
		var rec schema.Outcome
		if err := rec.UnmarshalMsgpack(m.Data); err != nil {
			return nil, fmt.Errorf("decode outcome: %w", err)
		}
		out[in.id] = &latest{rec: rec, seq: m.Sequence}
	}
	return out, nil
}

// pendingOutcome is one record to write: rec at its next revision on top of
// prev (nil for a first record).
type pendingOutcome struct {
	rec  schema.Outcome
	prev *latest
}

// outcomeWrites are records sent by startOutcomes and not yet awaited.
type outcomeWrites struct {
	ws    []pendingOutcome
	ps    []pending
	start time.Time
}

// startOutcomes sends every record without waiting.
func (s *Service) startOutcomes(tenant string, ws []pendingOutcome) (*outcomeWrites, error) {
	ow := &outcomeWrites{ws: ws, ps: make([]pending, len(ws)), start: time.Now()}
	for i := range ws {
		m, err := s.prepareOutcome(tenant, &ws[i])
		if err != nil {
			return nil, err
		}
		if m != nil {
			ow.ps[i] = publishAsync(s.js, m)
		}
	}
	return ow, nil
}

// finishOutcomes waits for the records startOutcomes sent. A write that
// met a record it did not expect re-reads the subject and writes on top of
// the newest record, unless that record already says the same.
func (s *Service) finishOutcomes(ctx context.Context, tenant string, ow *outcomeWrites) error {
	if len(ow.ws) == 0 {
		return nil
	}
	defer func() { s.m.stage.WithLabelValues("outcome").Observe(time.Since(ow.start).Seconds()) }()
	for i, p := range ow.ps {
		if p.msg == nil {
			continue
		}
		switch r := p.await(ctx, s.js); {
		case outcomeConflict(r):
			if err := s.writeOutcomeCAS(ctx, tenant, ow.ws[i].rec); err != nil {
				return err
			}
		case r.err != nil:
			return fmt.Errorf("write outcome: %w", r.err)
		}
	}
	return nil
}

// writeOutcomes writes every record, pipelined, and waits for them.
func (s *Service) writeOutcomes(ctx context.Context, tenant string, ws []pendingOutcome) error {
	ow, err := s.startOutcomes(tenant, ws)
	if err != nil {
		return err
	}
	return s.finishOutcomes(ctx, tenant, ow)
}

// outcomeConflict reports whether an outcome write did not store this
// record because the subject had moved: the expected sequence did not
// match, or (replicated streams) another write to it was in flight.
func outcomeConflict(r pubResult) bool {
	return isWrongLast(r.err)
}

// prepareOutcome fills in revision and time and returns the message, or nil
// when the previous record already says the same.
func (s *Service) prepareOutcome(tenant string, w *pendingOutcome) (*nats.Msg, error) {
	var expect uint64
	w.rec.Revision = 1
	if w.prev != nil {
		// Ingest never writes on top of an admitted input's record.
		if admitted(w.prev) || sameOutcome(w.prev.rec, w.rec) {
			return nil, nil
		}
		w.rec.Revision = w.prev.rec.Revision + 1
		expect = w.prev.seq
	}
	if w.rec.Time.IsZero() {
		w.rec.Time = time.Now().UTC()
	}
	return outcomeMsg(tenant, w.rec, expect)
}

// writeOutcomeCAS writes rec on top of whatever the subject holds now.
func (s *Service) writeOutcomeCAS(ctx context.Context, tenant string, rec schema.Outcome) error {
	subj, err := subject.Outcome(tenant, hex.EncodeToString(rec.MessageID))
	if err != nil {
		return fmt.Errorf("outcome subject: %w", err)
	}
	for attempt := range casAttempts {
		if attempt > 0 {
			// Let the concurrent writer's record land.
			if err := sleepCtx(ctx, time.Duration(attempt)*10*time.Millisecond); err != nil {
				return err
			}
		}
		prev, err := s.readOutcome(ctx, subj)
		if err != nil {
			return err
		}
		w := pendingOutcome{rec: rec, prev: prev}
		m, err := s.prepareOutcome(tenant, &w)
		if err != nil || m == nil {
			return err
		}
		ack, err := publishSettled(ctx, s.js, m)
		switch r := (pubResult{ack: ack, err: err}); {
		case outcomeConflict(r):
		case err != nil:
			return fmt.Errorf("write outcome: %w", err)
		default:
			return nil
		}
	}
	return errors.New("write outcome: concurrent writers kept the subject moving")
}
