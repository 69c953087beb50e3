package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
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
	msgs, err := Msgs(events, len(o.extra)+1)
	if err != nil {
		return 0, err
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

	seq, stream, err := PublishAtomic(ctx, js, msgs)
	if err != nil {
		return 0, fmt.Errorf("bus: publish batch: %w", classify(err))
	}
	if stream != streams.StreamEvents {
		return 0, fmt.Errorf("bus: batch stored in stream %q, want %s", stream, streams.StreamEvents)
	}
	return seq, nil
}

// Msgs validates events and builds their NATS messages, with room for
// spare more. An event id repeated among them is refused: the server would
// refuse the whole batch.
func Msgs(events []Event, spare int) ([]*nats.Msg, error) {
	msgs := make([]*nats.Msg, 0, len(events)+spare)
	ids := make(map[string]struct{}, len(events))
	var body []byte
	var err error
	for i, ev := range events {
		// The recipients of one message share one event value (its
		// payload pointers): it is encoded once for all of them.
		if i == 0 || ev.Event != events[i-1].Event {
			if body, err = ev.body(); err != nil {
				return nil, err
			}
		}
		m, err := ev.msg(body)
		if err != nil {
			return nil, err
		}
		if _, dup := ids[ev.ID]; dup {
			return nil, invalidEvent("id", errors.New("repeated within the batch"))
		}
		ids[ev.ID] = struct{}{}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// The headers of an atomic batch (ADR-50).
const (
	headerBatchID     = "Nats-Batch-Id"
	headerBatchSeq    = "Nats-Batch-Sequence"
	headerBatchCommit = "Nats-Batch-Commit"
)

// batchReply is the server's answer to a batch's first message (nothing,
// or an error) and to its commit.
type batchReply struct {
	Error    *jetstream.APIError `json:"error,omitempty"`
	Stream   string              `json:"stream"`
	Sequence uint64              `json:"seq"`
	BatchID  string              `json:"batch"`
	Count    int                 `json:"count"`
}

// PublishAtomic stores msgs in one atomic batch: all of them, in order,
// with consecutive sequences, or none. It returns the last one's sequence
// and its stream. It sets the batch headers on msgs in place, so they are
// the caller's for this batch alone; their headers are not copied (a
// batch of a large group holds a thousand events).
//
// As the server's flow control asks, the first message is acknowledged
// before the rest are sent; the commit is the last message.
func PublishAtomic(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg) (seq uint64, stream string, err error) {
	if len(msgs) == 0 {
		return 0, "", errors.New("bus: empty batch")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, js.Options().DefaultTimeout)
		defer cancel()
	}
	nc := js.Conn()
	// Header values are read-only once set: one batch id for all, and the
	// sequences in one backing array.
	id := []string{nuid.Next()}
	seqs := make([]string, len(msgs))
	for i, m := range msgs {
		if m.Header == nil {
			m.Header = nats.Header{}
		}
		delete(m.Header, headerBatchCommit) // a message of an earlier attempt
		seqs[i] = strconv.Itoa(i + 1)
		m.Header[headerBatchID] = id
		m.Header[headerBatchSeq] = seqs[i : i+1 : i+1]
	}
	last := len(msgs) - 1
	for i, m := range msgs[:last] {
		if i == 0 {
			if _, err := batchRequest(ctx, nc, m); err != nil {
				return 0, "", fmt.Errorf("bus: batch's first message: %w", err)
			}
			continue
		}
		if err := nc.PublishMsg(m); err != nil {
			return 0, "", fmt.Errorf("bus: batch message %d: %w", i+1, err)
		}
	}
	msgs[last].Header[headerBatchCommit] = []string{"1"}
	r, err := batchRequest(ctx, nc, msgs[last])
	if err != nil {
		return 0, "", err
	}
	if r.Stream == "" || r.BatchID != id[0] || r.Count != len(msgs) {
		return 0, "", fmt.Errorf("bus: batch acknowledgement for %q of %d messages, want %q of %d", r.BatchID, r.Count, id[0], len(msgs))
	}
	return r.Sequence, r.Stream, nil
}

// batchRequest sends m of a batch and reads the server's reply; an empty
// reply is an acknowledgement.
func batchRequest(ctx context.Context, nc *nats.Conn, m *nats.Msg) (batchReply, error) {
	var r batchReply
	resp, err := nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return r, err
	}
	if len(resp.Data) == 0 {
		return r, nil
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return r, fmt.Errorf("bus: batch reply: %w", err)
	}
	if r.Error != nil {
		return r, r.Error
	}
	return r, nil
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
