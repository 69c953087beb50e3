package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	c, err := CheckpointMsg(ck)
	if err != nil {
		return 0, err
	}
	b := Batch{items: make([]batchItem, 0, len(events)+len(o.extra)+1)}
	if err := b.AddEvents(events); err != nil {
		return 0, err
	}
	b.AddMsgs(o.extra...)
	b.AddMsgs(c)

	seq, stream, err := b.Publish(ctx, js)
	if err != nil {
		return 0, fmt.Errorf("bus: publish batch: %w", classify(err))
	}
	if stream != streams.StreamEvents {
		return 0, fmt.Errorf("bus: batch stored in stream %q, want %s", stream, streams.StreamEvents)
	}
	return seq, nil
}

// CheckpointMsg is ck's message, the last of its batch: on the group's
// checkpoint subject, committed only while ck.ExpectedSeq is the group's
// last checkpoint.
func CheckpointMsg(ck Checkpoint) (*nats.Msg, error) {
	subj, err := subject.Checkpoint(ck.Tenant, ck.GroupID)
	if err != nil {
		return nil, invalidEvent("checkpoint", err)
	}
	c := nats.NewMsg(subj)
	c.Data = ck.Data
	// Checkpoints must outlive the events' MaxAge (see package streams).
	c.Header.Set(jetstream.MsgTTLHeader, streams.CheckpointTTL)
	c.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(ck.ExpectedSeq, 10))
	// It replaces the group's earlier checkpoints, so they stay bounded
	// without a purge (issue 27).
	c.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	return c, nil
}

// Batch is the messages of one atomic batch, in order: events, validated
// and encoded as they are added, and other messages of FABRIC_EVENTS
// (readable records, checkpoints). The zero Batch is empty.
type Batch struct {
	items []batchItem
	ids   map[string]struct{}
}

// batchItem is an event, its subject and encoding, or another message.
type batchItem struct {
	ev   *Event
	subj string
	body []byte
	msg  *nats.Msg
}

// Len is the number of messages in b.
func (b *Batch) Len() int { return len(b.items) }

// AddEvents validates events and adds them; they must not change until b
// is published. An event id repeated in the batch is refused: the server
// would refuse the whole batch. Nothing is added when one is invalid.
func (b *Batch) AddEvents(events []Event) error {
	if b.ids == nil {
		b.ids = make(map[string]struct{}, len(events))
	}
	b.items = slices.Grow(b.items, len(events))
	n := len(b.items)
	var body []byte
	for i := range events {
		ev := &events[i]
		subj, err := ev.check()
		if err == nil && (i == 0 || ev.Event != events[i-1].Event) {
			// The recipients of one message share one event: it is
			// encoded once for all of them.
			body, err = ev.body()
		}
		if _, dup := b.ids[ev.ID]; err == nil && dup {
			err = invalidEvent("id", errors.New("repeated within the batch"))
		}
		if err != nil {
			b.drop(n)
			return err
		}
		b.ids[ev.ID] = struct{}{}
		b.items = append(b.items, batchItem{ev: ev, subj: subj, body: body})
	}
	return nil
}

// drop takes back the events added after the first n items.
func (b *Batch) drop(n int) {
	for _, it := range b.items[n:] {
		delete(b.ids, it.ev.ID)
	}
	b.items = b.items[:n]
}

// AddMsgs adds messages other than events. Publish sets the batch headers
// on them in place, so they are the batch's alone.
func (b *Batch) AddMsgs(msgs ...*nats.Msg) {
	for _, m := range msgs {
		b.items = append(b.items, batchItem{msg: m})
	}
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

// Publish stores b in one atomic batch: all of its messages, in order,
// with consecutive sequences, or none. It returns the last one's sequence
// and its stream. As the server's flow control asks, the first message is
// acknowledged before the rest are sent; the commit is the last message.
//
// An event's message is built as it is sent, in one message and header
// map reused for all of them (nats.go encodes a message as it sends it): a
// batch of a large group holds a thousand events, and a message and
// header map each were most of what converge allocated per recipient.
func (b *Batch) Publish(ctx context.Context, js jetstream.JetStream) (seq uint64, stream string, err error) {
	if len(b.items) == 0 {
		return 0, "", errors.New("bus: empty batch")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, js.Options().DefaultTimeout)
		defer cancel()
	}
	var (
		nc      = js.Conn()
		id      = []string{nuid.Next()}
		scratch = nats.Msg{Header: make(nats.Header, 6)}
		headers eventHeaders
		seqVal  [1]string // the message's sequence in the batch
	)
	last := len(b.items) - 1
	for i, it := range b.items {
		m := it.msg
		if m == nil {
			m = &scratch
			clear(m.Header)
			m.Subject, m.Data = it.subj, it.body
			it.ev.setHeaders(m.Header, &headers)
		} else if m.Header == nil {
			m.Header = nats.Header{}
		}
		seqVal[0] = strconv.Itoa(i + 1)
		m.Header[headerBatchID] = id
		if it.msg == nil {
			m.Header[headerBatchSeq] = seqVal[:]
		} else {
			m.Header[headerBatchSeq] = []string{seqVal[0]}
		}
		delete(m.Header, headerBatchCommit) // a message of an earlier attempt
		switch {
		case i == last:
			m.Header[headerBatchCommit] = one
			r, err := batchRequest(ctx, nc, m)
			if err != nil {
				return 0, "", err
			}
			if r.Stream == "" || r.BatchID != id[0] || r.Count != len(b.items) {
				return 0, "", fmt.Errorf("bus: batch acknowledgement for %q of %d messages, want %q of %d", r.BatchID, r.Count, id[0], len(b.items))
			}
			return r.Sequence, r.Stream, nil
		case i == 0:
			if _, err := batchRequest(ctx, nc, m); err != nil {
				return 0, "", fmt.Errorf("bus: batch's first message: %w", err)
			}
		default:
			if err := nc.PublishMsg(m); err != nil {
				return 0, "", fmt.Errorf("bus: batch message %d: %w", i+1, err)
			}
		}
	}
	return 0, "", errors.New("bus: batch not committed") // not reached: the last message commits
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
