package ingest

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// outboundBatch bounds one fetch of outbound messages.
const outboundBatch = 256

// startOutbound creates the outbound consumer (streams.ConsumerOutbound):
// through it ingest takes what the fabric's hosted clients send as input,
// so the group's other hosted members converge on it like on any input and
// an own commit comes back to be accepted (issue 19).
func (s *Service) startOutbound(ctx context.Context) (jetstream.Consumer, error) {
	return s.js.CreateOrUpdateConsumer(ctx, streams.StreamEvents, jetstream.ConsumerConfig{
		Durable:       streams.ConsumerOutbound,
		FilterSubject: subject.OutboundAll,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: 4 * outboundBatch,
	})
}

// runOutbound submits outbound messages to intake until ctx ends. FABRIC_IN
// stores an input once (its subject is its dedup record), so a message
// submitted twice (a lost ack, two ingests) is stored once. A message that
// cannot be stored now is left unacknowledged and comes again.
//
// The consumer is created here, retried until it is, not in Start: a
// clustered meta leader under load can take longer than one API timeout,
// and intake does not wait on it (an outbound message waits in its stream).
func (s *Service) runOutbound(ctx context.Context) {
	var c jetstream.Consumer
	for c == nil {
		var err error
		if c, err = s.startOutbound(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("ingest: outbound consumer, retrying", "err", err)
			_ = sleepCtx(ctx, time.Second)
		}
	}
	for ctx.Err() == nil {
		s.fetchOutbound(ctx, c)
	}
}

// fetchOutbound submits one fetch of outbound messages. The fetch waits at
// most a second, and ends when ctx does, so Shutdown does not wait out an
// idle pull.
func (s *Service) fetchOutbound(ctx context.Context, c jetstream.Consumer) {
	fctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	batch, err := c.Fetch(outboundBatch, jetstream.FetchContext(fctx))
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, jetstream.ErrNoMessages) {
			s.log.Warn("ingest: outbound fetch", "err", err)
			_ = sleepCtx(ctx, time.Second)
		}
		return
	}
	for msg := range batch.Messages() {
		s.loopOutbound(ctx, msg)
	}
	if err := batch.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
		s.log.Warn("ingest: outbound fetch", "err", err)
	}
}

// loopOutbound submits one outbound message as input of its tenant.
func (s *Service) loopOutbound(ctx context.Context, msg jetstream.Msg) {
	tenant, _, err := subject.ParseOutbound(msg.Subject())
	var tm schema.TransportMessage
	if err == nil {
		err = tm.UnmarshalMsgpack(msg.Data())
	}
	if err != nil {
		// Converge wrote it; nothing else may. Never retried.
		s.log.Error("ingest: outbound message does not decode", "err", err)
		_ = msg.Term()
		return
	}
	if _, err := s.Submit(ctx, tenant, "outbound", []schema.TransportMessage{tm}); err != nil {
		_ = msg.NakWithDelay(time.Second)
		return
	}
	_ = msg.Ack()
}
