package ingest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// retainedCount counts the tenant's objects on FABRIC_RETAINED.
func (s *Service) retainedCount(ctx context.Context, tenant string) (int, error) {
	filter, err := subject.RetainedTenant(tenant)
	if err != nil {
		return 0, err
	}
	info, err := s.retainedStream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, fmt.Errorf("count retained: %w", err)
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n, nil
}

// retain keeps inputs on FABRIC_RETAINED under the tenant's bound and
// records their outcomes, in one pipelined round. Over the bound an input is
// refused with resource_refused, which is never a duplicate record: a later
// delivery of the same bytes is processed afresh (inbound-processing.md,
// "Transport-deferred input").
func (s *Service) retain(ctx context.Context, tenant string, ins []*input) error {
	if len(ins) == 0 {
		return nil
	}
	n, err := s.retainedCount(ctx, tenant)
	if err != nil {
		return err
	}
	msgs := make([]*nats.Msg, len(ins))
	for i, in := range ins {
		if n >= s.cfg.Limits.MaxRetainedPerTenant {
			s.refuse(in)
			continue
		}
		if msgs[i], err = retainedMsg(tenant, in); err != nil {
			return err
		}
		n++
	}
	res, err := s.pub.publish(ctx, s.js, msgs)
	if err != nil {
		return fmt.Errorf("retain: %w", err)
	}
	records := make([]pendingOutcome, len(ins))
	for i, in := range ins {
		switch err := res[i].err; {
		case msgs[i] == nil:
		case err == nil:
			s.m.retained.WithLabelValues(in.reason).Inc()
		case isLimit(err):
			s.refuse(in)
		default:
			return fmt.Errorf("retain: %w", err)
		}
		records[i] = pendingOutcome{rec: s.record(in)}
		in.step = stepDone
	}
	if err := s.writeOutcomes(ctx, tenant, records); err != nil {
		return err
	}
	// The watch may have moved while this ran; if it did, the retry it
	// scheduled may have found nothing yet. A group that became known
	// meanwhile is backfilled before the request is answered: input sent
	// after this answer must find this input entered or still retained
	// ahead of it (issue 26). The group record is read from the leader, as
	// another worker's watch may have seen it first and backfilled already.
	checked := map[string]bool{}
	for i, in := range ins {
		if msgs[i] == nil || in.res.Category == schema.CategoryResourceRefused {
			continue
		}
		switch {
		case in.reason == reasonUnknown && !checked[in.groupKey]:
			checked[in.groupKey] = true
			known := s.dir.known(in.groupKey)
			if !known {
				if known, err = s.confirmHosted(ctx, in.groupKey); err != nil {
					return err
				}
			}
			if known {
				if err := s.backfill(ctx, tenant, in.groupHex, true); err != nil {
					return err
				}
			}
		case in.reason == reasonDeferred && s.dir.keyGen(in.groupKey) != in.keyGen:
			s.retry.schedule(retryKey{tenant: tenant, group: in.groupHex, reason: in.reason})
		}
	}
	return nil
}

// retainedMsg is the message that retains an input. An unknown-group input
// keeps its peeled bytes, which no longer need a key; a transport-deferred
// one its sealed original.
func retainedMsg(tenant string, in *input) (*nats.Msg, error) {
	obj := in.msg
	if in.reason == reasonUnknown {
		obj = schema.TransportMessage{V: schema.TransportVersion, Group: in.msg.Group, Kind: schema.TransportMLS, Payload: in.mls}
	}
	body, err := obj.MarshalMsgpack()
	if err != nil {
		return nil, fmt.Errorf("encode retained object: %w", err)
	}
	subj, err := subject.Retained(tenant, in.groupHex, in.reason)
	if err != nil {
		return nil, fmt.Errorf("retained subject: %w", err)
	}
	m := nats.NewMsg(subj)
	m.Data = body
	m.Header.Set(jetstream.MsgIDHeader, "rt."+tenant+"."+in.reason+"."+hex.EncodeToString(in.id[:]))
	return m, nil
}

// refuse gives an input resource_refused.
func (s *Service) refuse(in *input) {
	in.settle(stepDone, schema.StatusRejected, schema.CategoryResourceRefused)
	s.m.refusals.WithLabelValues("resource_refused").Inc()
}

// retryRetained offers every object retained for a group and reason to the
// pipeline again. Objects that now go on are removed; the others stay.
// Several workers may retry the same object at once: the dedup record and
// Nats-Msg-Id make the input enter once, and removal tolerates a removal
// by another worker.
func (s *Service) retryRetained(ctx context.Context, k retryKey) error {
	subj, err := subject.Retained(k.tenant, k.group, k.reason)
	if err != nil {
		return err
	}
	s.m.retries.WithLabelValues(k.reason).Inc()
	for seq := uint64(1); ; {
		m, err := bus.GetMsg(ctx, s.js, streamRetained, bus.MsgRequest{Seq: seq, NextBySubject: subj})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read retained: %w", err)
		}
		seq = m.Sequence + 1
		var msg schema.TransportMessage
		if err := msg.UnmarshalMsgpack(m.Data); err != nil {
			// Not something ingest wrote; drop it rather than retry forever.
			s.log.Warn("dropping undecodable retained object", "err", err)
			s.deleteRetained(ctx, m.Sequence, k.reason)
			continue
		}
		in := &input{msg: msg, retained: true}
		s.prepare(k.tenant, in)
		if err := s.run(ctx, k.tenant, []*input{in}); err != nil {
			return err
		}
		if in.step == stepKeep {
			continue
		}
		if err := s.recordTransportID(ctx, k.tenant, in); err != nil {
			return err
		}
		s.count("retained", []*input{in})
		s.deleteRetained(ctx, m.Sequence, k.reason)
	}
}

// recordTransportID gives a sealed object that was deferred under its
// transport id the outcome its peeled input got, so a caller polling the
// transport id sees it settle.
func (s *Service) recordTransportID(ctx context.Context, tenant string, in *input) error {
	if in.msg.Kind != schema.TransportSealed || in.transportID == in.id {
		return nil
	}
	rec := s.record(in)
	rec.MessageID = in.transportID[:]
	return s.writeOutcomeCAS(ctx, tenant, rec)
}

func (s *Service) deleteRetained(ctx context.Context, seq uint64, reason string) {
	err := s.retainedStream.DeleteMsg(ctx, seq)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) && !errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		s.log.Warn("removing retained object", "err", err)
		return
	}
	if err == nil {
		s.m.released.WithLabelValues(reason).Inc()
	}
}
