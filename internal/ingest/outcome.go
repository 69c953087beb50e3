package ingest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fabric-mls/fabric/internal/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	m, err := getMsg(ctx, s.cfg.Conn, streamOutcomes, msgGetRequest{LastFor: subj})
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

// sameOutcome reports whether a record already says what rec says.
func sameOutcome(a, b schema.Outcome) bool {
	return a.Status == b.Status && a.Category == b.Category && a.Disposition == b.Disposition && a.Class == b.Class
}

// outcomeMsg builds the record message. Its Nats-Msg-Id follows converge's
// scheme (oc.<tenant>.<id>.<revision>), so a retried write of the same
// revision is stored once; Nats-Expected-Last-Subject-Sequence makes every
// write a compare-and-set on the input's subject, so revisions never fork.
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
	m.Header.Set(jetstream.MsgIDHeader, "oc."+tenant+"."+idHex+"."+strconv.FormatUint(rec.Revision, 10))
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	return m, nil
}

// pendingOutcome is one record to write: rec at its next revision on top of
// prev (nil for a first record).
type pendingOutcome struct {
	rec  schema.Outcome
	prev *latest
}

// writeOutcomes writes every record, pipelined. A write that meets a record
// it did not expect re-reads the subject and writes on top of the newest
// record, unless that record already says the same.
func (s *Service) writeOutcomes(ctx context.Context, tenant string, ws []pendingOutcome) error {
	if len(ws) == 0 {
		return nil
	}
	start := time.Now()
	defer func() { s.m.stage.WithLabelValues("outcome").Observe(time.Since(start).Seconds()) }()
	msgs := make([]*nats.Msg, len(ws))
	for i := range ws {
		m, err := s.prepareOutcome(tenant, &ws[i])
		if err != nil {
			return err
		}
		msgs[i] = m
	}
	res := publishAll(ctx, s.js, msgs)
	for i, r := range res {
		switch {
		case msgs[i] == nil:
		case outcomeConflict(r):
			if err := s.writeOutcomeCAS(ctx, tenant, ws[i].rec); err != nil {
				return err
			}
		case r.err != nil:
			return fmt.Errorf("write outcome: %w", r.err)
		}
	}
	return nil
}

// outcomeConflict reports whether an outcome write did not store this
// record because the subject had moved: the expected sequence did not
// match, or (replicated streams check Nats-Msg-Id first) a record of the
// same revision was already stored, which may say something else.
func outcomeConflict(r pubResult) bool {
	return isWrongLast(r.err) || (r.err == nil && r.ack != nil && r.ack.Duplicate)
}

// prepareOutcome fills in revision and time and returns the message, or nil
// when the previous record already says the same.
func (s *Service) prepareOutcome(tenant string, w *pendingOutcome) (*nats.Msg, error) {
	var expect uint64
	w.rec.Revision = 1
	if w.prev != nil {
		// Ingest never writes on top of a decision of convergence.
		if entered(w.prev) || sameOutcome(w.prev.rec, w.rec) {
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
