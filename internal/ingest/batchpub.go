package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// batchPublisher publishes a request's writes (its inputs, and the objects
// it retains) as plain NATS publishes whose JetStream acknowledgements all
// come back to one wildcard subscription of the worker. An admitted input
// then costs its write and a few nanoseconds of bookkeeping, not a future
// with channels and a JSON decode of a routine acknowledgement each
// (docs/ingest.md, "Throughput"): the inputs are the hot path of ingest,
// one per message sent.
type batchPublisher struct {
	nc     *nats.Conn
	prefix string // <inbox>. ; the reply of publish n is prefix + n

	mu      sync.Mutex
	sub     *nats.Subscription
	next    uint64
	waiting map[uint64]pubSlot
}

// pubSlot is where the acknowledgement of one publish goes.
type pubSlot struct {
	b *pubBatch
	i int
}

// pubBatch is one call's publishes and their results.
type pubBatch struct {
	res  []pubResult
	left int // acknowledgements still owed; under batchPublisher.mu
	done chan struct{}
}

func newBatchPublisher(nc *nats.Conn) *batchPublisher {
	return &batchPublisher{nc: nc, prefix: nc.NewInbox() + ".", waiting: map[uint64]pubSlot{}}
}

// start subscribes to the acknowledgements.
func (p *batchPublisher) start() error {
	sub, err := p.nc.Subscribe(p.prefix+"*", p.ack)
	if err != nil {
		return fmt.Errorf("subscribe acknowledgements: %w", err)
	}
	// The publishes in flight are bounded by the requests in flight; the
	// acknowledgements must never be dropped as a slow consumer's.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("acknowledgement limits: %w", err)
	}
	p.mu.Lock()
	p.sub = sub
	p.mu.Unlock()
	return nil
}

// stop ends the subscription; a publish still waiting ends with its
// context.
func (p *batchPublisher) stop() {
	p.mu.Lock()
	sub := p.sub
	p.sub = nil
	p.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
}

// publish publishes every non-nil message and waits for every
// acknowledgement, or for ctx. A message whose subject another worker is
// writing right now (replicated streams) is published again once that
// settles, so each result is stored or an error the caller classifies.
func (p *batchPublisher) publish(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg) ([]pubResult, error) {
	b := &pubBatch{res: make([]pubResult, len(msgs)), done: make(chan struct{})}
	ids := make([]uint64, 0, len(msgs))
	p.mu.Lock()
	if p.sub == nil {
		p.mu.Unlock()
		return nil, errors.New("ingest: publisher not started")
	}
	for i, m := range msgs {
		if m == nil {
			continue
		}
		p.next++
		ids = append(ids, p.next)
		p.waiting[p.next] = pubSlot{b: b, i: i}
		b.left++
	}
	if b.left == 0 {
		close(b.done)
	}
	p.mu.Unlock()
	defer p.forget(ids)
	p.setReplies(msgs, ids)
	for _, m := range msgs {
		if m == nil {
			continue
		}
		if err := p.nc.PublishMsg(m); err != nil {
			return nil, fmt.Errorf("publish input: %w", err)
		}
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("acknowledgements: %w", ctx.Err())
	}
	for i, r := range b.res {
		if isInProcess(r.err) {
			m := msgs[i]
			m.Reply = ""
			ack, err := publishSettled(ctx, js, m)
			b.res[i] = pubResult{ack: ack, err: err}
		}
	}
	return b.res, nil
}

// setReplies gives the non-nil messages of msgs, in order, the reply
// subjects of ids, all in one allocation: a request's inputs are
// published together.
func (p *batchPublisher) setReplies(msgs []*nats.Msg, ids []uint64) {
	if len(ids) == 0 {
		return
	}
	var digits [20]byte // a uint64 in decimal
	var b strings.Builder
	// ids grow, so the last is the longest.
	b.Grow(len(ids) * (len(p.prefix) + len(strconv.AppendUint(digits[:0], ids[len(ids)-1], 10))))
	for _, id := range ids {
		b.WriteString(p.prefix)
		b.Write(strconv.AppendUint(digits[:0], id, 10))
	}
	all := b.String()
	k, start := 0, 0
	for _, m := range msgs {
		if m == nil {
			continue
		}
		end := start + len(p.prefix) + len(strconv.AppendUint(digits[:0], ids[k], 10))
		m.Reply = all[start:end]
		start = end
		k++
	}
}

// forget drops the slots of publishes no longer waited for.
func (p *batchPublisher) forget(ids []uint64) {
	p.mu.Lock()
	for _, id := range ids {
		delete(p.waiting, id)
	}
	p.mu.Unlock()
}

// ack takes one acknowledgement to its slot.
func (p *batchPublisher) ack(m *nats.Msg) {
	tok := m.Subject[len(p.prefix):]
	id, err := strconv.ParseUint(tok, 10, 64)
	if err != nil {
		return
	}
	r := parseAck(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	slot, ok := p.waiting[id]
	if !ok {
		return // its caller gave up
	}
	delete(p.waiting, id)
	slot.b.res[slot.i] = r
	if slot.b.left--; slot.b.left == 0 {
		close(slot.b.done)
	}
}

// streamName is name as a string, without a copy for the streams ingest
// writes to: every acknowledgement names one.
func streamName(name []byte) string {
	switch string(name) {
	case streamIn:
		return streamIn
	case streamRetained:
		return streamRetained
	case streamOutcomes:
		return streamOutcomes
	}
	return string(name)
}

// ackPrefix is how the server begins a stored message's acknowledgement;
// anything else (an error, an unexpected shape) is decoded in full.
var ackPrefix = []byte(`{"stream":"`)

// parseAck reads a JetStream publish acknowledgement: the stream and
// sequence of a stored message, or the API error that refused it.
func parseAck(m *nats.Msg) pubResult {
	if m.Header.Get("Status") == "503" {
		return pubResult{err: nats.ErrNoResponders}
	}
	d := m.Data
	if rest, ok := bytes.CutPrefix(d, ackPrefix); ok {
		if name, rest, ok := bytes.Cut(rest, []byte(`","seq":`)); ok && len(name) > 0 && bytes.IndexByte(name, '"') < 0 {
			end := bytes.IndexAny(rest, ",}")
			if end > 0 && rest[len(rest)-1] == '}' && !bytes.Contains(rest[end:], []byte(`"error"`)) {
				if seq, err := strconv.ParseUint(string(rest[:end]), 10, 64); err == nil {
					return pubResult{ack: &jetstream.PubAck{Stream: streamName(name), Sequence: seq, Duplicate: bytes.Contains(rest[end:], []byte(`"duplicate":true`))}}
				}
			}
		}
	}
	var resp struct {
		jetstream.PubAck
		Error *jetstream.APIError `json:"error,omitempty"`
	}
	if err := json.Unmarshal(d, &resp); err != nil {
		return pubResult{err: fmt.Errorf("acknowledgement: %w", err)}
	}
	if resp.Error != nil {
		return pubResult{err: resp.Error}
	}
	if resp.Stream == "" {
		return pubResult{err: errors.New("acknowledgement names no stream")}
	}
	return pubResult{ack: &resp.PubAck}
}
