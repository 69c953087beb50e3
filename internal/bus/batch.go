package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
)

// DefaultMaxBatch is nats-server's default limit on messages in one atomic
// batch (jetstream { limits { batch { max_msgs } } }); a batch holds the
// events plus one checkpoint.
const DefaultMaxBatch = 1000

// BatchOpt configures PublishBatch.
type BatchOpt func(*batchOpts)

type batchOpts struct {
	max   int
	extra []*nats.Msg
}

// WithMaxBatch sets the server's atomic batch limit, when its operator
// raised it above DefaultMaxBatch: fewer, larger batches per group.
func WithMaxBatch(n int) BatchOpt {
	return func(o *batchOpts) {
		if n > 0 {
			o.max = n
		}
	}
}

// WithMessages adds messages of FABRIC_EVENTS other than events to the
// batch, after the events and before the checkpoint: stored with them, or
// not at all.
func WithMessages(msgs []*nats.Msg) BatchOpt {
	return func(o *batchOpts) { o.extra = msgs }
}

// Errors PublishBatch returns, for errors.Is. Both mean the batch was not
// stored now; whether an earlier attempt stored it, the caller learns by
// reading the checkpoint again (LastCheckpoint).
var (
	// ErrFenced: the group's last checkpoint is not the one the batch
	// expected. Another worker, or an earlier attempt of this one, has
	// committed since: this worker must not emit (DESIGN.md section 5).
	ErrFenced = errors.New("bus: checkpoint fence: expected checkpoint is stale")
	// ErrDuplicateEvent: an event id of the batch is already stored, so the
	// server refused the whole batch.
	ErrDuplicateEvent = errors.New("bus: batch holds an event id already stored")
)

// BatchTooLargeError reports a batch over the server's atomic batch limit.
// The caller must split the work into several checkpointed batches.
type BatchTooLargeError struct {
	// Events is how many events the batch had; at most Limit-1 fit.
	Events int
	// Limit is the atomic batch limit in messages.
	Limit int
}

func (e *BatchTooLargeError) Error() string {
	return fmt.Sprintf("bus: batch of %d events exceeds the atomic batch limit of %d events plus a checkpoint", e.Events, e.Limit-1)
}

// Checkpoint is converge's state checkpoint for a group, committed with the
// events it produced.
type Checkpoint struct {
	// Tenant and GroupID (lowercase hex) name the group.
	Tenant  string
	GroupID string
	// Data is the checkpoint's content, opaque here.
	Data []byte
	// ExpectedSeq is the stream sequence of the group's last checkpoint as
	// this worker knows it, 0 when the group has none. The batch commits
	// only if it is still the last.
	ExpectedSeq uint64
}

// PublishBatch stores events and the checkpoint as one atomic batch: all or
// nothing, with consecutive sequences, the checkpoint last. It returns the
// checkpoint's sequence, the ExpectedSeq of the group's next batch.
//
// Observed behaviour (tests, R1 and R3): a stale ExpectedSeq fails the whole
// batch with ErrFenced (server code 10071; 10164 when another write to the
// checkpoint is in flight on R3). An event id already stored fails it with
// ErrDuplicateEvent (10201), checked before the expectation, so a retry of a
// committed batch gets ErrDuplicateEvent, not success.
//
// Cost: on an R1 file-storage stream the server stages every batch in its
// own fsynced file store, about 15 ms per batch on the test machine
// whatever its size (BenchmarkPublishBatch100); on R3 it stages in memory.
// Put all the events of one pass in one batch rather than many small ones.
//
// A batch holds at most DefaultMaxBatch messages, or what WithMaxBatch says
// the server allows.
func PublishBatch(ctx context.Context, js jetstream.JetStream, events []Event, ck Checkpoint, opts ...BatchOpt) (ckSeq uint64, err error) {
	o := batchOpts{max: DefaultMaxBatch}
	for _, opt := range opts {
		opt(&o)
	}
	if len(events)+len(o.extra)+1 > o.max {
		return 0, &BatchTooLargeError{Events: len(events) + len(o.extra), Limit: o.max}
	}
	ckSubj, err := subject.Checkpoint(ck.Tenant, ck.GroupID)
	if err != nil {
		return 0, invalidEvent("checkpoint", err)
	}
	msgs := make([]*nats.Msg, 0, len(events)+len(o.extra)+1)
	ids := make(map[string]struct{}, len(events))
	for _, ev := range events {
		m, err := ev.Msg()
		if err != nil {
			return 0, err
		}
		// The server would refuse the whole batch; say why here.
		if _, dup := ids[ev.ID]; dup {
			return 0, invalidEvent("id", errors.New("repeated within the batch"))
		}
		ids[ev.ID] = struct{}{}
		msgs = append(msgs, m)
	}
	msgs = append(msgs, o.extra...)
	c := nats.NewMsg(ckSubj)
	c.Data = ck.Data
	// Checkpoints must outlive the events' MaxAge (see package streams).
	c.Header.Set(jetstream.MsgTTLHeader, streams.CheckpointTTL)
	c.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(ck.ExpectedSeq, 10))
	// It replaces the group's earlier checkpoints, so they stay bounded
	// without a purge (issue 27).
	c.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	msgs = append(msgs, c)

	ack, err := jetstreamext.PublishMsgBatch(ctx, js, msgs)
	if err != nil {
		return 0, fmt.Errorf("bus: publish batch: %w", classify(err))
	}
	if ack.Stream != streams.StreamEvents {
		return 0, fmt.Errorf("bus: batch stored in stream %q, want %s", ack.Stream, streams.StreamEvents)
	}
	return ack.Sequence, nil
}

// classify adds ErrFenced or ErrDuplicateEvent to a server error, keeping
// the API error reachable with errors.As.
func classify(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return err
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return fmt.Errorf("%w: %w", ErrFenced, err)
	case jetstreamext.JSErrCodeBatchPublishDuplicateMsgID:
		return fmt.Errorf("%w: %w", ErrDuplicateEvent, err)
	}
	return err
}

// LastCheckpoint reads a group's last checkpoint from the stream leader,
// not by direct get, which a lagging follower may answer. It returns
// sequence 0 and no data when the group has no checkpoint.
func LastCheckpoint(ctx context.Context, js jetstream.JetStream, tenant, groupHex string) (seq uint64, data []byte, err error) {
	subj, err := subject.Checkpoint(tenant, groupHex)
	if err != nil {
		return 0, nil, invalidEvent("checkpoint", err)
	}
	seq, data, err = ReadMsg(ctx, js, subj, 0)
	if err != nil {
		return 0, nil, fmt.Errorf("bus: read checkpoint: %w", err)
	}
	return seq, data, nil
}

// ReadMsg reads one message of FABRIC_EVENTS from the stream leader, not by
// direct get: the last on subj when from is 0, else the first on subj at
// or after sequence from. It returns sequence 0 and no data when there is
// none.
func ReadMsg(ctx context.Context, js jetstream.JetStream, subj string, from uint64) (seq uint64, data []byte, err error) {
	r := MsgRequest{LastBySubject: subj}
	if from != 0 {
		r = MsgRequest{Seq: from, NextBySubject: subj}
	}
	m, err := GetMsg(ctx, js, streams.StreamEvents, r)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, err
	}
	return m.Sequence, m.Data, nil
}
