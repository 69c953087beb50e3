package converge

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/pkg/schema"
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
	// Consumed are the KeyPackages this transaction's joins used. They
	// are retired after the batch (Marmot joining.md steps 11–12); a
	// retry finds them here and retires them again, which is idempotent.
	Consumed []consumedKeyPackage `msgpack:"consumed,omitempty"`
	// Chunks name the blobs of a version 2 group state's message index
	// chunks, in order (index.go); a version 3 checkpoint names none.
	Chunks []chunkRef `msgpack:"chunks,omitempty"`
	// MemberChunks name, per hosted client whose blob is a split
	// convergence state, the blobs of its settled chunks, in order
	// (convergence.Group.MarshalSplit).
	MemberChunks map[string][]string `msgpack:"member_chunks,omitempty"`
	// Parts counts the parts of each blob it names that was too large for
	// one message (see putBlobs), so the parts go when the blob does.
	Parts map[string]int `msgpack:"parts,omitempty"`
	// Pending is the part of the transaction's batch not stored yet
	// (spill.go): stored before any later input is applied.
	Pending *pendingBatch `msgpack:"pending,omitempty"`
	// Worker is the worker that wrote it (diagnostics only).
	Worker string `msgpack:"worker"`
}

// named returns the keys of the blobs c names: the group state, the
// members' states and the message index chunks.
func (c checkpoint) named() []string {
	var out []string
	if c.State != "" {
		out = append(out, c.State)
	}
	for _, k := range c.Members {
		out = append(out, k)
	}
	for _, r := range c.Chunks {
		out = append(out, r.Key)
	}
	for _, keys := range c.MemberChunks {
		out = append(out, keys...)
	}
	if c.Pending != nil {
		out = append(out, c.Pending.Key)
	}
	return out
}

// setMemberChunks names the settled chunk blobs of client's state.
func (c *checkpoint) setMemberChunks(client string, keys []string) {
	if c.MemberChunks == nil {
		c.MemberChunks = map[string][]string{}
	}
	c.MemberChunks[client] = keys
}

// consumedKeyPackage is a KeyPackage of a hosted client a join used.
type consumedKeyPackage struct {
	ClientID string `msgpack:"client_id"`
	Ref      []byte `msgpack:"ref"`
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
	if err := schema.UnmarshalMsgpack(b, &c); err != nil {
		return checkpoint{}, fmt.Errorf("decode checkpoint: %w", err)
	}
	if c.V != checkpointVersion {
		return checkpoint{}, fmt.Errorf("decode checkpoint: unknown version %d", c.V)
	}
	return c, nil
}

// ErrFenced reports that a commit lost the fence: another write to the
// group's checkpoint happened since this worker read it, or an earlier
// attempt of this one stored the batch. The caller reloads the group.
var ErrFenced = errors.New("converge: fenced: group checkpoint moved")

// readCheckpoint returns a group's newest checkpoint and its stream
// sequence (0 when the group has none), read from the stream leader.
func readCheckpoint(ctx context.Context, js jetstream.JetStream, tenant, groupHex string) (checkpoint, uint64, error) {
	seq, data, err := bus.LastCheckpoint(ctx, js, tenant, groupHex)
	if err != nil || seq == 0 {
		return checkpoint{}, 0, err
	}
	c, err := decodeCheckpoint(data)
	if err != nil {
		return checkpoint{}, 0, err
	}
	return c, seq, nil
}

// commitBatch stores the events, the index writes ix and the checkpoint as
// one atomic batch of at most maxBatch messages, fenced on the checkpoint sequence the worker
// loaded (DESIGN section 5).
func commitBatch(ctx context.Context, js jetstream.JetStream, maxBatch int, tenant, groupHex string, expect uint64, ck checkpoint, events []bus.Event, ix []*nats.Msg) (uint64, error) {
	body, err := encodeCheckpoint(ck)
	if err != nil {
		return 0, err
	}
	seq, err := bus.PublishBatch(ctx, js, events, bus.Checkpoint{Tenant: tenant, GroupID: groupHex, Data: body, ExpectedSeq: expect}, bus.WithMaxBatch(maxBatch), bus.WithMessages(ix))
	if errors.Is(err, bus.ErrFenced) || isConflict(err) {
		return 0, fmt.Errorf("%w: %w", ErrFenced, err)
	}
	return seq, err
}

// duplicate reports a batch refused for an event id already stored (checked
// before the fence): an earlier attempt of the transaction stored it when
// the group's checkpoint moved, else another write stored those events
// (transact tells which).
func duplicate(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, bus.ErrDuplicateEvent) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jetstreamext.JSErrCodeBatchPublishDuplicateMsgID)
}

// fencedErr reports the server errors that mean "the fence moved": wrong
// last sequence (10071), another write in flight on the subject (10164,
// JSErrCodeStreamWrongLastSequenceConstant). A duplicate message id
// (10201) is no fence (duplicate).
func fencedErr(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			return true
		}
	}
	return false
}
