package converge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
	"github.com/vmihailenco/msgpack/v5"
)

// checkpointVersion is the version of the checkpoint record format.
const checkpointVersion = 1

// checkpoint is the record on fabric.ck.<tenant>.<group> (FABRIC_EVENTS)
// that makes a group's state current. It is written in one atomic batch with
// the events of the transaction it ends, and carries
// Nats-Expected-Last-Subject-Sequence = the sequence of the checkpoint it
// replaces: a worker whose view of the group is not the newest, because
// another worker has written since, cannot commit anything (the fence).
// State blobs in KV fabric-converge are written before the batch under keys
// only this checkpoint names; a blob no checkpoint names is ignored.
type checkpoint struct {
	V int `msgpack:"v"`
	// InputSeq is the FABRIC_IN stream sequence of the last input applied
	// to the group; an input at or below it is already done.
	InputSeq uint64 `msgpack:"input_seq"`
	// Txn names the transaction this checkpoint ends: "in:<seq>" for an
	// input, "exp:<unix_ms>" for a cleanup pass.
	Txn string `msgpack:"txn"`
	// State is the fabric-converge key of the group state blob.
	State string `msgpack:"state"`
	// Members maps a hosted client id to the fabric-converge key of its
	// engine state blob.
	Members map[string]string `msgpack:"members"`
	// NextExpiry is the earliest expiry (unix ms) of a message the group
	// still holds under disappearing messages; 0 for none.
	NextExpiry int64 `msgpack:"next_expiry,omitempty"`
	// Outcomes are the outcome records this transaction decided. They are
	// published after the batch; a retry finds them here and republishes
	// them under the same Nats-Msg-Id.
	Outcomes []outcomeNote `msgpack:"outcomes,omitempty"`
	// Worker is the worker that wrote it (diagnostics only).
	Worker string `msgpack:"worker"`
}

func encodeCheckpoint(c checkpoint) ([]byte, error) {
	c.V = checkpointVersion
	b, err := msgpack.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	return b, nil
}

// decodeCheckpoint decodes a checkpoint record; bad bytes give an error.
func decodeCheckpoint(b []byte) (checkpoint, error) {
	var c checkpoint
	if err := msgpack.Unmarshal(b, &c); err != nil {
		return checkpoint{}, fmt.Errorf("decode checkpoint: %w", err)
	}
	if c.V != checkpointVersion {
		return checkpoint{}, fmt.Errorf("decode checkpoint: unknown version %d", c.V)
	}
	return c, nil
}

// ErrFenced reports that a commit lost the fence: another write to the
// group's checkpoint happened since this worker read it. The caller reloads
// the group from its newest checkpoint.
var ErrFenced = errors.New("converge: fenced: group checkpoint moved")

// maxBatch bounds one atomic batch (the server's default limit).
const maxBatch = 1000

// fence writes checkpoints and events of FABRIC_EVENTS.
type fence struct {
	js     jetstream.JetStream
	nc     *nats.Conn
	stream string
}

// read returns the newest checkpoint of a group and its stream sequence, or
// seq 0 when the group has none. It asks the stream leader (not a direct
// get, which a lagging follower may answer), so a worker that just lost
// the fence sees the winner's checkpoint.
func (f *fence) read(ctx context.Context, subject string) (checkpoint, uint64, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": subject})
	resp, err := f.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+f.stream, req)
	if err != nil {
		return checkpoint{}, 0, fmt.Errorf("read checkpoint: %w", err)
	}
	var r struct {
		Error *jetstream.APIError `json:"error"`
		Msg   *struct {
			Seq  uint64 `json:"seq"`
			Data []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return checkpoint{}, 0, fmt.Errorf("read checkpoint: %w", err)
	}
	if r.Error != nil {
		if r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return checkpoint{}, 0, nil
		}
		return checkpoint{}, 0, fmt.Errorf("read checkpoint: %w", r.Error)
	}
	if r.Msg == nil {
		return checkpoint{}, 0, errors.New("read checkpoint: empty answer")
	}
	c, err := decodeCheckpoint(r.Msg.Data)
	if err != nil {
		return checkpoint{}, 0, err
	}
	return c, r.Msg.Seq, nil
}

// commit stores the checkpoint and the events as one atomic batch. The
// checkpoint goes first and carries the expected last sequence of its
// subject; events follow in emission order. It returns the checkpoint's new
// stream sequence. A lost fence, or a batch that may have committed before
// (a duplicate event id rejects the whole batch), returns ErrFenced: the
// caller re-reads the checkpoint to learn which.
func (f *fence) commit(ctx context.Context, subject string, expect uint64, ck checkpoint, events []*nats.Msg) (uint64, error) {
	if len(events)+1 > maxBatch {
		return 0, fmt.Errorf("commit: %d events exceed one atomic batch", len(events))
	}
	body, err := encodeCheckpoint(ck)
	if err != nil {
		return 0, err
	}
	ckMsg := nats.NewMsg(subject)
	ckMsg.Data = body
	ckMsg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	msgs := make([]*nats.Msg, 0, len(events)+1)
	msgs = append(msgs, ckMsg)
	msgs = append(msgs, events...)
	ack, err := jetstreamext.PublishMsgBatch(ctx, f.js, msgs)
	if err != nil {
		if fencedErr(err) {
			return 0, fmt.Errorf("%w (%v)", ErrFenced, err)
		}
		return 0, fmt.Errorf("commit batch: %w", err)
	}
	// A batch is stored under consecutive sequences; the checkpoint is first.
	return ack.Sequence - uint64(len(msgs)) + 1, nil
}

// fencedErr reports the errors that mean "the fence moved, or this batch
// may already be stored": wrong last sequence (10071), another write in
// flight on the subject (10164), a duplicate message id (10201).
func fencedErr(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, 10164, jetstreamext.JSErrCodeBatchPublishDuplicateMsgID:
			return true
		}
	}
	return false
}
