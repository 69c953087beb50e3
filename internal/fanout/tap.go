package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/eventbus"
	"github.com/fabric-mls/fabric/internal/fanout/filter"
	"github.com/fabric-mls/fabric/internal/fanout/wire"
	"github.com/fabric-mls/fabric/internal/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Headers the stream adds to a republished or directly fetched copy.
const (
	headerSequence = "Nats-Sequence"
	headerStatus   = "Status"
)

// event is one event as every subscription shares it: decoded once, encoded
// once per encoding.
type event struct {
	seq     uint64
	kind    schema.EventKind
	emitted time.Time // the stream's Nats-Time-Stamp
	msgpack []byte    // the stored body: the ClientEvent in msgpack
	json    []byte    // set by the tap before it is handed to a JSON subscriber
}

// encoded returns the event's bytes in enc.
func (e *event) encoded(enc wire.Encoding) []byte {
	if enc == wire.Msgpack {
		return e.msgpack
	}
	return e.json
}

// tap is the one core NATS subscription on a client's republished subject,
// shared by that client's subscriptions on this gateway (EVENT-013).
type tap struct {
	g       *Gateway
	key     string
	live    string // fabric.live.<tenant>.<client>
	events  string // fabric.ev.<tenant>.<client>, for direct gets
	refs    int    // guarded by g.tapsMu
	mu      sync.Mutex
	started bool
	stopped bool
	nsub    *nats.Subscription
	lastSeq uint64 // the last stream sequence handed to subscriptions
	subs    map[*subscription]struct{}
}

// attach registers s with its client's tap, starting the tap if it is the
// first. When attach returns, every event that reaches the gateway later is
// offered to s, and none before (EVENT-014); s.startSeq is the registration
// point. A resumed subscription (afterSeq > 0, below the registration point)
// first gets the events stored after afterSeq, replayed from the stream.
func (g *Gateway) attach(ctx context.Context, s *subscription, afterSeq uint64) error {
	live, err := subject.Live(s.tenant, s.client)
	if err != nil {
		return err
	}
	events, err := subject.Events(s.tenant, s.client)
	if err != nil {
		return err
	}
	g.tapsMu.Lock()
	t := g.taps[live]
	if t == nil {
		t = &tap{g: g, key: live, live: live, events: events, subs: make(map[*subscription]struct{})}
		g.taps[live] = t
	}
	t.refs++
	g.tapsMu.Unlock()

	t.mu.Lock()
	if !t.started {
		if err := t.start(ctx); err != nil {
			t.mu.Unlock()
			g.release(t)
			return err
		}
	}
	if afterSeq > 0 && afterSeq < t.lastSeq {
		t.replay(s, afterSeq)
	}
	t.subs[s] = struct{}{}
	s.tap = t
	s.startSeq = t.lastSeq
	t.mu.Unlock()
	return nil
}

// replay offers s the events stored on the client's subject after afterSeq
// up to the tap's last handed-off sequence, from the stream, in order.
// Called with t.mu held, so live events wait behind the replay.
func (t *tap) replay(s *subscription, afterSeq uint64) {
	g := t.g
	only := map[*subscription]struct{}{s: {}}
	next := afterSeq + 1
	for fetched := 0; next <= t.lastSeq; fetched++ {
		if fetched >= g.cfg.MaxRepair {
			s.c.discard(s, 1)
			return
		}
		d, body, err := t.fetch(next)
		if errors.Is(err, errNotFound) {
			return
		}
		if err != nil {
			g.log.Warn("fanout: replay for a resumed subscription", "err", err)
			s.c.discard(s, 1)
			return
		}
		if d.Sequence > t.lastSeq {
			return
		}
		t.offer(only, &d, body)
		g.metrics.replayed.Inc()
		next = d.Sequence + 1
	}
}

// detach removes s from its tap; the last subscription removes the tap.
// After detach returns no event is offered to s.
func (g *Gateway) detach(s *subscription) {
	t := s.tap
	if t == nil {
		return
	}
	t.mu.Lock()
	delete(t.subs, s)
	t.mu.Unlock()
	g.release(t)
}

func (g *Gateway) release(t *tap) {
	g.tapsMu.Lock()
	t.refs--
	last := t.refs == 0
	if last {
		delete(g.taps, t.key)
	}
	g.tapsMu.Unlock()
	if !last {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	if t.nsub != nil {
		if err := t.nsub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			g.log.Warn("fanout: remove tap", "err", err)
		}
		t.nsub = nil
		g.metrics.taps.Dec()
	}
}

// start subscribes, waits until the server has the subscription, then reads
// the subject's last stored sequence: events stored after it arrive on the
// tap or are repaired from it. Called with t.mu held, so the tap's handler
// waits until lastSeq is set.
func (t *tap) start(ctx context.Context) error {
	nsub, err := t.g.cfg.NATS.Subscribe(t.live, t.onMsg)
	if err != nil {
		return fmt.Errorf("subscribe tap: %w", err)
	}
	fctx, cancel := context.WithTimeout(ctx, t.g.cfg.RequestTimeout)
	defer cancel()
	if err := t.g.cfg.NATS.FlushWithContext(fctx); err != nil {
		_ = nsub.Unsubscribe()
		return fmt.Errorf("flush tap subscription: %w", err)
	}
	last, err := t.g.lastSequence(fctx, t.events)
	if err != nil {
		_ = nsub.Unsubscribe()
		return err
	}
	t.nsub = nsub
	t.lastSeq = last
	t.started = true
	t.g.metrics.taps.Inc()
	return nil
}

// onMsg handles one republished event. It runs on the tap's own NATS
// delivery goroutine, so a tap's events are handled one at a time, in order.
func (t *tap) onMsg(m *nats.Msg) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	d, err := eventbus.Decode(m)
	if err != nil {
		// Without a usable sequence the event cannot be placed; the next
		// event's Nats-Last-Sequence reveals it as a gap and repair fetches
		// it, or reports it if it stays undecodable.
		t.g.metrics.undecodable.Inc()
		t.g.log.Warn("fanout: undecodable republished event", "err", err)
		return
	}
	if d.Sequence <= t.lastSeq {
		return // already handed off, by repair or before the tap started
	}
	if d.LastSequence > t.lastSeq {
		t.repair(d.LastSequence)
	}
	t.dispatch(&d, m.Data)
	t.lastSeq = d.Sequence
}

// repair fetches the events stored on the client's subject after lastSeq up
// to and including upTo, whose republished copies never arrived, and hands
// them off in order before the event that revealed the gap.
func (t *tap) repair(upTo uint64) {
	g := t.g
	g.metrics.gaps.Inc()
	for fetched := 0; t.lastSeq < upTo; fetched++ {
		if fetched >= g.cfg.MaxRepair {
			t.unrepaired("repair bound reached")
			return
		}
		d, body, err := t.fetch(t.lastSeq + 1)
		if errors.Is(err, errNotFound) {
			return // deleted from the stream before it could be repaired
		}
		if err != nil {
			g.log.Warn("fanout: repair gap", "err", err)
			t.unrepaired("fetch failed")
			return
		}
		if d.Sequence > upTo {
			return
		}
		t.dispatch(&d, body)
		t.lastSeq = d.Sequence
		g.metrics.repaired.Inc()
	}
}

// fetch reads the client's first stored event at or after seq.
func (t *tap) fetch(seq uint64) (eventbus.Delivered, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), t.g.cfg.RequestTimeout)
	defer cancel()
	m, err := t.g.directGet(ctx, t.events, seq)
	if err != nil {
		return eventbus.Delivered{}, nil, err
	}
	d, err := eventbus.Decode(m)
	if err != nil {
		return eventbus.Delivered{}, nil, err
	}
	if d.Sequence < seq {
		return eventbus.Delivered{}, nil, errors.New("direct get answered an earlier sequence")
	}
	return d, m.Data, nil
}

// heal repairs the events stored after the tap's last one, if any.
func (t *tap) heal() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.started || t.stopped {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.g.cfg.RequestTimeout)
	last, err := t.g.lastSequence(ctx, t.events)
	cancel()
	if err != nil {
		t.g.log.Warn("fanout: heal tap", "err", err)
		return
	}
	if last > t.lastSeq {
		t.repair(last)
	}
}

// unrepaired reports a gap the gateway could not fill to every subscription
// as a discard, so each of them hands off a lagged before its next event
// (EVENT-031). How many of the missing events a filter would have selected is
// unknown; one is counted.
func (t *tap) unrepaired(why string) {
	t.g.metrics.unrepaired.Inc()
	t.g.log.Warn("fanout: gap not repaired", "why", why)
	for s := range t.subs {
		s.c.discard(s, 1)
	}
}

// dispatch offers one event to every subscription of the tap.
func (t *tap) dispatch(d *eventbus.Delivered, body []byte) {
	t.g.metrics.received.Inc()
	t.offer(t.subs, d, body)
}

// offer offers one decoded event to each of subs whose filter selects it
// (EVENT-020). The msgpack body is shared as stored; JSON is encoded once,
// on the first JSON subscriber.
func (t *tap) offer(subs map[*subscription]struct{}, d *eventbus.Delivered, body []byte) {
	if len(subs) == 0 {
		return
	}
	fe := filter.Describe(&d.Event, d.ConversationKey, d.ReferencesOwn)
	ev := &event{seq: d.Sequence, kind: d.Event.Kind, emitted: d.Time, msgpack: body}
	for s := range subs {
		if !s.filter.Match(&fe) {
			continue
		}
		if s.c.enc == wire.JSON && ev.json == nil {
			b, err := d.Event.AppendJSON(nil)
			if err != nil {
				t.g.log.Warn("fanout: encode event", "err", err)
				return
			}
			ev.json = b
		}
		s.c.push(s, ev)
	}
}

var errNotFound = errors.New("no such message")

// directGet fetches the first message at or after seq on subj from the
// events stream (ADR-31 next_by_subj).
func (g *Gateway) directGet(ctx context.Context, subj string, seq uint64) (*nats.Msg, error) {
	req, _ := json.Marshal(struct {
		Seq        uint64 `json:"seq"`
		NextBySubj string `json:"next_by_subj"`
	}{seq, subj})
	return g.direct(ctx, "$JS.API.DIRECT.GET."+g.cfg.Stream, req)
}

// lastSequence returns the stream sequence of the last message stored on
// subj, or 0 when there is none.
func (g *Gateway) lastSequence(ctx context.Context, subj string) (uint64, error) {
	m, err := g.direct(ctx, "$JS.API.DIRECT.GET."+g.cfg.Stream+"."+subj, nil)
	if errors.Is(err, errNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	seq, err := strconv.ParseUint(m.Header.Get(headerSequence), 10, 64)
	if err != nil {
		return 0, errors.New("direct get: answer without a sequence")
	}
	return seq, nil
}

func (g *Gateway) direct(ctx context.Context, api string, req []byte) (*nats.Msg, error) {
	m, err := g.cfg.NATS.RequestWithContext(ctx, api, req)
	if err != nil {
		return nil, fmt.Errorf("direct get: %w", err)
	}
	switch st := m.Header.Get(headerStatus); st {
	case "":
		return m, nil
	case "404":
		return nil, errNotFound
	default:
		return nil, fmt.Errorf("direct get: status %s", st)
	}
}
