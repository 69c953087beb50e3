package converge

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// A transaction whose batch does not fit one atomic batch (a Welcome to
// more hosted members than -max-batch allows, a pass or commit that
// settles a large backlog, an expiry of many messages) is not refused and
// retried for ever, holding its partition: it is committed in several
// batches. The first stores the new state's checkpoint, the first
// -max-batch − 1 messages, and names a blob (written before, like every
// state blob) that holds the rest; each later batch stores the next
// messages and the same checkpoint with its progress (pending.done), each
// fenced on the one before. Until the rest is stored no later input of the
// group is applied: whoever loads the group stores it first (drain), with
// the event ids it had, so every event is stored once (EVENT-001).

// pendingBatch is the part of a transaction's batch not stored yet.
type pendingBatch struct {
	// Key is the blob that holds the messages after the first batch.
	Key string `msgpack:"key"`
	// Done counts those already stored.
	Done int `msgpack:"done,omitempty"`
}

// pendingMsg is one stored message of a pending batch.
type pendingMsg struct {
	Subject string              `msgpack:"subject"`
	Header  map[string][]string `msgpack:"header,omitempty"`
	Data    []byte              `msgpack:"data,omitempty"`
}

func encodePending(msgs []*nats.Msg) ([]byte, error) {
	out := make([]pendingMsg, len(msgs))
	for i, m := range msgs {
		out[i] = pendingMsg{Subject: m.Subject, Header: m.Header, Data: m.Data}
	}
	b, err := msgpack.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode pending batch: %w", err)
	}
	return b, nil
}

func decodePending(b []byte) ([]*nats.Msg, error) {
	var in []pendingMsg
	if err := schema.UnmarshalMsgpack(b, &in); err != nil {
		return nil, fmt.Errorf("decode pending batch: %w", err)
	}
	out := make([]*nats.Msg, len(in))
	for i, p := range in {
		if p.Subject == "" {
			return nil, errors.New("decode pending batch: message without subject")
		}
		out[i] = &nats.Msg{Subject: p.Subject, Header: p.Header, Data: p.Data}
	}
	return out, nil
}

// batchMsgs are the messages of a transaction's batch but its checkpoint:
// its events, then its index writes.
func batchMsgs(events []bus.Event, ix []*nats.Msg) ([]*nats.Msg, error) {
	out := make([]*nats.Msg, 0, len(events)+len(ix))
	for _, ev := range events {
		m, err := ev.Msg()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return append(out, ix...), nil
}

// fits reports whether a transaction's batch fits one atomic batch.
func (w *Worker) fits(events []bus.Event, ix []*nats.Msg) bool {
	return len(events)+len(ix)+1 <= w.cfg.MaxBatch
}

// spill cuts a batch that does not fit: it writes the messages after the
// first -max-batch − 1 to a blob, names it in next, and returns the first
// ones and the key written.
func (w *Worker) spill(ctx context.Context, tenant, groupHex string, next *checkpoint, events []bus.Event, ix []*nats.Msg) ([]*nats.Msg, []string, error) {
	msgs, err := batchMsgs(events, ix)
	if err != nil {
		return nil, nil, err
	}
	cut := w.cfg.MaxBatch - 1
	b, err := encodePending(msgs[cut:])
	if err != nil {
		return nil, nil, err
	}
	key, err := freshKey(tenant, groupHex, "q") // <tenant>.<group>.q.<nonce>
	if err != nil {
		return nil, nil, err
	}
	written, parts, err := w.putBlobs(ctx, map[string][]byte{key: b})
	if err != nil {
		return nil, written, err
	}
	next.Pending = &pendingBatch{Key: key}
	if n := parts[key]; n > 0 {
		if next.Parts == nil {
			next.Parts = map[string]int{}
		}
		next.Parts[key] = n
	}
	return msgs[:cut], written, nil
}

// drain stores the rest of a group's last transaction, batch after batch,
// each fenced on the checkpoint before; g is brought up to the last. A
// failure leaves g to be loaded again, and the next load goes on where
// the stored checkpoint says.
func (w *Worker) drain(ctx context.Context, part *partition, g *loadedGroup) error {
	p := g.ck.Pending
	if p == nil {
		return nil
	}
	key := g.tenant + "." + g.groupHex
	parts := g.ck.Parts[p.Key]
	b, err := w.getBlob(ctx, p.Key)
	if err != nil {
		delete(part.groups, key)
		return fmt.Errorf("read pending batch: %w", err)
	}
	msgs, err := decodePending(b)
	if err != nil {
		delete(part.groups, key)
		return err
	}
	for done := p.Done; done < len(msgs); {
		if err := w.cfg.hooks.beforeDrain(); err != nil {
			delete(part.groups, key)
			return err
		}
		end := min(done+w.cfg.MaxBatch-1, len(msgs))
		ck := g.ck
		ck.Pending = &pendingBatch{Key: p.Key, Done: end}
		if end == len(msgs) {
			ck.Pending = nil
			ck.Parts = without(ck.Parts, p.Key)
		}
		seq, err := commitBatch(ctx, w.js, w.cfg.MaxBatch, g.tenant, g.groupHex, g.ckSeq, ck, nil, msgs[done:end])
		if err != nil {
			delete(part.groups, key)
			if errors.Is(err, ErrFenced) {
				w.metrics.Fenced.Inc()
			}
			return fmt.Errorf("store pending batch: %w", err)
		}
		w.metrics.Batches.WithLabelValues("1").Inc()
		g.ck, g.ckSeq, done = ck, seq, end
	}
	stale := []string{p.Key}
	for i := range parts {
		stale = append(stale, partKey(p.Key, i))
	}
	w.purge(ctx, stale)
	return nil
}

// without returns parts without key, nil when nothing is left.
func without(parts map[string]int, key string) map[string]int {
	if _, ok := parts[key]; !ok {
		return parts
	}
	out := make(map[string]int, len(parts))
	for k, n := range parts {
		if k != key {
			out[k] = n
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
