package ingest

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/fabric-mls/fabric/internal/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Names of the streams and buckets ingest uses (docs/architecture.md).
const (
	streamIn       = streams.StreamInput
	streamOutcomes = streams.StreamOutcomes
	streamRetained = streams.StreamRetained
	bucketSeen     = streams.BucketSeen
	bucketKeys     = streams.BucketGroupKeys
	bucketGroups   = streams.BucketGroups
)

// Headers ingest sets on fabric.in.<tenant>.<group> (docs/ingest.md).
const (
	// HeaderClass carries the input class (schema.InputClass).
	HeaderClass = "Fabric-Class"
	// HeaderMessageID carries the message id in lowercase hex.
	HeaderMessageID = "Fabric-Message-Id"
)

// API error codes ingest branches on.
const (
	errCodeWrongLastSeq   jetstream.ErrorCode = 10071 // expected last subject sequence mismatch
	errCodeProposalFlight jetstream.ErrorCode = 10164 // another write to the subject in flight (R>1)
	errCodeStoreFailed    jetstream.ErrorCode = 10077 // store failed, e.g. a limit reached with DiscardNew
)

// stallWait bounds how long an async publish waits for room under the
// pending limit before it fails.
const stallWait = 5 * time.Second

// isWrongLast reports whether err is a failed create-if-absent: the subject
// already holds a message, or (replicated streams) another write to it is in
// flight, which is treated the same way: someone else created it.
func isWrongLast(err error) bool {
	var ae *jetstream.APIError
	if !errors.As(err, &ae) {
		return false
	}
	return ae.ErrorCode == errCodeWrongLastSeq || ae.ErrorCode == errCodeProposalFlight
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

// publishAll publishes every non-nil message asynchronously, so a batch
// costs one round trip rather than one per message, and waits for every
// acknowledgement.
func publishAll(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg) []pubResult {
	res := make([]pubResult, len(msgs))
	futs := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		if m == nil {
			continue
		}
		f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(stallWait))
		if err != nil {
			res[i].err = err
			continue
		}
		futs[i] = f
	}
	for i, f := range futs {
		if f == nil {
			continue
		}
		select {
		case a := <-f.Ok():
			res[i].ack = a
		case err := <-f.Err():
			res[i].err = err
		case <-ctx.Done():
			res[i].err = ctx.Err()
		}
	}
	return res
}
