package ingest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fabric-mls/fabric/internal/binding"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// step is what the pipeline does next with an input.
type step int

const (
	stepReject step = iota + 1 // record the category; done
	stepRetain                 // retain on FABRIC_RETAINED for reason
	stepEnter                  // deduplicate, record queued, publish
	stepDone                   // the result is final and recorded
	stepKeep                   // a retained input that still cannot go on
)

// Reasons an object is retained; they are the last token of its
// fabric.retained subject and label values of the retained metrics.
const (
	reasonDeferred = string(schema.CategoryTransportDeferred)
	reasonUnknown  = string(schema.CategoryUnknownGroup)
)

// classUnpeeled is the class recorded for a sealed object no key has opened
// yet: the schema has no class for bytes that are not yet an MLSMessage.
const classUnpeeled = schema.ClassUnsupported

// input is one transport message on its way through the pipeline.
type input struct {
	msg schema.TransportMessage
	// retained is set when the input was re-offered from FABRIC_RETAINED.
	retained bool
	// transportID is SHA-256 of a sealed payload.
	transportID [sha256.Size]byte
	keyGen      uint64 // generation of the key set the peel tried
	mls         []byte
	id          [sha256.Size]byte
	class       schema.InputClass
	groupHex    string
	groupKey    string // <tenant>.<group>
	reason      string // for stepRetain
	step        step
	res         Result
}

func (in *input) settle(st step, status schema.OutcomeStatus, cat schema.Category) {
	in.step = st
	in.res = Result{MessageID: in.id[:], Status: status, Category: cat}
}

func (in *input) reject(cat schema.Category) { in.settle(stepReject, schema.StatusRejected, cat) }

// prepare peels and classifies an input and decides its next step. It does
// no I/O. Whatever the bytes, it does not take the worker down: a panic in
// a decoder is contained and the input fails closed as invalid_encoding.
func (s *Service) prepare(tenant string, in *input) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("decoder panicked on input; rejected as invalid_encoding")
			in.id = sha256.Sum256(in.msg.Payload)
			in.class = schema.ClassMalformed
			in.reject(schema.CategoryInvalidEncoding)
		}
	}()
	s.peelAndClassify(tenant, in)
}

func (s *Service) peelAndClassify(tenant string, in *input) {
	in.groupHex = hex.EncodeToString(in.msg.Group)
	key, err := subject.GroupKey(tenant, in.groupHex)
	if err != nil {
		// Intake checks tenant and group length; this is a guard.
		in.id = sha256.Sum256(in.msg.Payload)
		in.class = schema.ClassMalformed
		in.reject(schema.CategoryWrongRecipient)
		return
	}
	in.groupKey = key
	mls := []byte(in.msg.Payload)
	if in.msg.Kind == schema.TransportSealed {
		in.transportID = sha256.Sum256(in.msg.Payload)
		keys, gen := s.dir.candidateKeys(key)
		in.keyGen = gen
		mls, err = binding.Peel(in.msg, keys)
		if err != nil {
			in.id = in.transportID
			in.class = classUnpeeled
			var be *binding.Error
			if errors.As(err, &be) && be.Category == schema.CategoryTransportDeferred {
				in.reason = reasonDeferred
				in.settle(stepRetain, schema.StatusDeferred, schema.CategoryTransportDeferred)
				return
			}
			in.class = schema.ClassMalformed
			in.reject(schema.CategoryInvalidEncoding)
			return
		}
	}
	in.mls = mls
	cls, err := engine.Classify(mls)
	if err != nil {
		in.id = engine.NewMessageID(mls)
		cat := engine.CategoryOf(err)
		in.class = schema.ClassUnsupported
		if cat == "" || cat == schema.CategoryInvalidEncoding {
			cat = schema.CategoryInvalidEncoding
			in.class = schema.ClassMalformed
		}
		in.reject(cat)
		return
	}
	in.id = cls.MessageID
	in.class = cls.Class
	switch cls.Class {
	case schema.ClassWelcome:
		// A welcome goes to the group its hint names; it is what makes a
		// group known, so it skips the known-group check.
		in.settle(stepEnter, schema.StatusQueued, "")
		return
	case schema.ClassCommit, schema.ClassProposal, schema.ClassApplication:
		if !bytes.Equal(cls.GroupID, in.msg.Group) {
			// Routed to a group the MLS message does not belong to.
			in.reject(schema.CategoryWrongRecipient)
			return
		}
	default:
		// A GroupInfo or KeyPackage is not group input.
		in.reject(schema.CategoryUnsupportedRequiredFeature)
		return
	}
	if !s.dir.known(key) {
		in.reason = reasonUnknown
		in.settle(stepRetain, schema.StatusRejected, schema.CategoryUnknownGroup)
		return
	}
	in.settle(stepEnter, schema.StatusQueued, "")
}

// run takes prepared inputs to their outcome: rejections and retentions are
// recorded, the rest deduplicated and published. An error means some input
// may not have been handled; none was acknowledged, and a retry is safe.
func (s *Service) run(ctx context.Context, tenant string, ins []*input) error {
	var enter, retain []*input
	var rejects []pendingOutcome
	for _, in := range ins {
		switch in.step {
		case stepReject:
			rejects = append(rejects, pendingOutcome{rec: s.record(in)})
			in.step = stepDone
		case stepRetain:
			if err := s.checkRetain(ctx, tenant, in); err != nil {
				return err
			}
			switch in.step {
			case stepEnter:
				enter = append(enter, in)
			case stepRetain:
				retain = append(retain, in)
			}
		case stepEnter:
			enter = append(enter, in)
		}
	}
	if err := s.writeOutcomes(ctx, tenant, rejects); err != nil {
		return err
	}
	if err := s.retain(ctx, tenant, retain); err != nil {
		return err
	}
	return s.enter(ctx, tenant, enter)
}

// record is the outcome record an input's result makes.
func (s *Service) record(in *input) schema.Outcome {
	return schema.Outcome{
		MessageID: in.res.MessageID,
		Class:     in.class,
		Status:    in.res.Status,
		Category:  in.res.Category,
	}
}

// checkRetain looks again at an input that cannot go on yet. An
// unknown-group input that already entered convergence once is deduplicated
// instead (stepEnter), so its outcome is not overwritten; a retained input
// that still cannot go on stays where it is (stepKeep); the others stay at
// stepRetain.
func (s *Service) checkRetain(ctx context.Context, tenant string, in *input) error {
	if in.reason == reasonUnknown {
		seen, err := s.seenExists(ctx, tenant, in.id)
		if err != nil {
			return err
		}
		if seen {
			in.settle(stepEnter, schema.StatusQueued, "")
			return nil
		}
	}
	if in.retained {
		in.step = stepKeep
	}
	return nil
}

func (s *Service) seenExists(ctx context.Context, tenant string, id [sha256.Size]byte) (bool, error) {
	key, err := subject.SeenKey(tenant, hex.EncodeToString(id[:]))
	if err != nil {
		return false, fmt.Errorf("seen key: %w", err)
	}
	_, err = s.seen.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read seen record: %w", err)
	}
	return true, nil
}

// preConvergence reports whether a category is one ingest gives an input
// that may still enter convergence later.
func preConvergence(c schema.Category) bool {
	return c == schema.CategoryUnknownGroup || c == schema.CategoryTransportDeferred || c == schema.CategoryResourceRefused
}

// entered reports whether convergence has decided about the input: it gave
// a disposition or a terminal rejection. Ingest never writes on top of such
// a record, and an input that has one is a duplicate.
func entered(l *latest) bool {
	if l == nil {
		return false
	}
	r := l.rec
	return r.Disposition != "" || (r.Status == schema.StatusRejected && !preConvergence(r.Category))
}

// enter deduplicates inputs and publishes the new ones onto their group's
// input subject, in two pipelined rounds:
//
//  1. together, the create-if-absent of fabric-seen <tenant>.<message_id>
//     (the dedup record that outlives JetStream's window) and the
//     create-if-absent of the first outcome record, queued: it is written
//     before the publish so that convergence, which appends to the same
//     subject, always comes after it, and being create-if-absent it never
//     overwrites a record;
//  2. the publish with Nats-Msg-Id = <tenant>.<message_id>, which dedups
//     inside the window.
//
// An input whose outcome already shows a decision of convergence is a
// duplicate. Any other existing record is ambiguous (an earlier attempt may
// have failed between the rounds, or is in flight on another worker): the
// input is published again and JetStream's window answers whether the
// earlier attempt landed. So an input is never lost, and never published
// twice inside the window.
func (s *Service) enter(ctx context.Context, tenant string, ins []*input) error {
	if len(ins) == 0 {
		return nil
	}
	start := time.Now()
	now := strconv.FormatInt(start.UnixMilli(), 10)
	msgs := make([]*nats.Msg, 2*len(ins))
	for i, in := range ins {
		key, err := subject.SeenKey(tenant, hex.EncodeToString(in.id[:]))
		if err != nil {
			return fmt.Errorf("seen key: %w", err)
		}
		m := nats.NewMsg(s.seenPrefix + key)
		m.Data = []byte(now)
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		msgs[2*i] = m
		w := pendingOutcome{rec: s.record(in)}
		if msgs[2*i+1], err = s.prepareOutcome(tenant, &w); err != nil {
			return err
		}
	}
	res := publishAll(ctx, s.js, msgs)
	s.m.stage.WithLabelValues("dedup").Observe(time.Since(start).Seconds())

	var pub []*input
	for i, in := range ins {
		seenErr, rec := res[2*i].err, res[2*i+1]
		if seenErr != nil && !isWrongLast(seenErr) {
			return fmt.Errorf("create seen record: %w", seenErr)
		}
		if rec.err != nil || outcomeConflict(rec) {
			if !outcomeConflict(rec) {
				return fmt.Errorf("write outcome: %w", rec.err)
			}
			subj, err := subject.Outcome(tenant, hex.EncodeToString(in.id[:]))
			if err != nil {
				return fmt.Errorf("outcome subject: %w", err)
			}
			prev, err := s.readOutcome(ctx, subj)
			if err != nil {
				return err
			}
			if entered(prev) {
				in.settle(stepDone, schema.StatusRejected, schema.CategoryDuplicate)
				continue
			}
			if err := s.writeOutcomeCAS(ctx, tenant, s.record(in)); err != nil {
				return err
			}
		}
		pub = append(pub, in)
	}

	start = time.Now()
	msgs = msgs[:len(pub)]
	for i, in := range pub {
		subj, err := subject.Input(tenant, in.groupHex)
		if err != nil {
			return fmt.Errorf("input subject: %w", err)
		}
		idHex := hex.EncodeToString(in.id[:])
		m := nats.NewMsg(subj)
		m.Data = in.mls
		m.Header.Set(jetstream.MsgIDHeader, tenant+"."+idHex)
		m.Header.Set(HeaderClass, string(in.class))
		m.Header.Set(HeaderMessageID, idHex)
		msgs[i] = m
	}
	res = publishAll(ctx, s.js, msgs)
	s.m.stage.WithLabelValues("publish").Observe(time.Since(start).Seconds())
	for i, in := range pub {
		if res[i].err != nil {
			return fmt.Errorf("publish input: %w", res[i].err)
		}
		if res[i].ack.Duplicate {
			in.settle(stepDone, schema.StatusRejected, schema.CategoryDuplicate)
			continue
		}
		in.step = stepDone
	}
	return nil
}
