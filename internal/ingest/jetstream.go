package ingest

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/streams"
)

// Names of the streams and buckets ingest uses (docs/architecture.md).
const (
	streamIn       = streams.StreamInput
	streamOutcomes = streams.StreamOutcomes
	streamRetained = streams.StreamRetained
	bucketKeys     = streams.BucketGroupKeys
	bucketGroups   = streams.BucketGroups
)

// API error codes ingest branches on that jetstream does not name.
const (
	errCodeStoreFailed    jetstream.ErrorCode = 10077 // store failed, e.g. a limit reached with DiscardNew
	errCodeMsgIDInProcess jetstream.ErrorCode = 10158 // R>1: a write with the same Nats-Msg-Id is in process
)

// stallWait bounds how long an async publish waits for room under the
// pending limit before it fails.
const stallWait = 5 * time.Second

// isWrongLast reports whether err is a failed create-if-absent: the subject
// already holds a message.
func isWrongLast(err error) bool {
	if err == nil {
		return false // without the target escaping: this runs per input
	}
	var ae *jetstream.APIError
	return errors.As(err, &ae) && ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// isInProcess reports whether err says that another worker's write to the
// same subject (or of the same Nats-Msg-Id) is being stored right now
// (replicated streams; jetstream calls the subject's code
// JSErrCodeStreamWrongLastSequenceConstant). It may still fail, so it is
// waited out: once it settles, the same publish is stored or reports that
// it exists.
func isInProcess(err error) bool {
	if err == nil {
		return false
	}
	var ae *jetstream.APIError
	return errors.As(err, &ae) && (ae.ErrorCode == errCodeMsgIDInProcess || ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// inProcessAttempts bounds the waits for another worker's write of the
// same message id.
const inProcessAttempts = 10

// publishSettled publishes m, waiting out another worker's write of the
// same subject or Nats-Msg-Id if one is in process, so the answer is either
// stored or duplicate.
func publishSettled(ctx context.Context, js jetstream.JetStream, m *nats.Msg) (*jetstream.PubAck, error) {
	for attempt := 1; ; attempt++ {
		ack, err := js.PublishMsg(ctx, m)
		if !isInProcess(err) || attempt == inProcessAttempts {
			return ack, err
		}
		if err := sleepCtx(ctx, time.Duration(attempt)*10*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// isLimit reports whether err is a stream limit refusing a write.
func isLimit(err error) bool {
	var ae *jetstream.APIError
	if !errors.As(err, &ae) {
		return false
	}
	return ae.ErrorCode == errCodeStoreFailed && strings.HasPrefix(ae.Description, "maximum")
}

// pubResult is the outcome of one asynchronous publish.
type pubResult struct {
	ack *jetstream.PubAck
	err error
}

// pending is one asynchronous publish whose acknowledgement is awaited
// later.
type pending struct {
	msg *nats.Msg
	fut jetstream.PubAckFuture
	err error // the publish failed before it was sent
}

// publishAsync sends m without waiting for its acknowledgement. The
// client's pending limit (WithPublishAsyncMaxPending) bounds the publishes
// in flight per worker; beyond it a publish waits up to stallWait for room.
func publishAsync(js jetstream.JetStream, m *nats.Msg) pending {
	f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(stallWait))
	return pending{msg: m, fut: f, err: err}
}

// await waits for p's acknowledgement. A message whose subject or
// Nats-Msg-Id another worker is storing right now (replicated streams) is
// published again once that settles, so the answer is stored or duplicate.
func (p pending) await(ctx context.Context, js jetstream.JetStream) pubResult {
	if p.err != nil {
		return pubResult{err: p.err}
	}
	select {
	case a := <-p.fut.Ok():
		return pubResult{ack: a}
	case err := <-p.fut.Err():
		if isInProcess(err) {
			ack, err := publishSettled(ctx, js, p.msg)
			return pubResult{ack: ack, err: err}
		}
		return pubResult{err: err}
	case <-ctx.Done():
		return pubResult{err: ctx.Err()}
	}
}
