package fanout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/fanout/filter"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// event is one event as every subscription shares it: decoded once, encoded
// once per encoding.
type event struct {
	seq     uint64
	id      string // the event id (Nats-Msg-Id), sent in the event frame
	kind    schema.EventKind
	emitted time.Time // the stream's Nats-Time-Stamp
	msgpack []byte    // the stored body: the ClientEvent in msgpack
	json    []byte    // set by the tap before it is handed to a JSON subscriber
}

// sequence is the event's stream sequence, by which a lagged says where its
// run ends.
func (e *event) sequence() uint64 { return e.seq }

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
	// dm holds the stitched-DM conversation key of each group whose events
	// carried one, learnt from the client's events (see learn).
	dm map[string][]byte
}

// attach registers s with its client's tap, starting the tap if it is the
// first. When attach returns, every event stored later is offered to s, and
// none stored before (EVENT-014); s.startSeq is the registration point. A
// subscription that replays (resumed, or started from the stream) gets every
// event stored after afterSeq, which may be 0: those the tap already handed
// off are replayed from the stream first.
func (g *Gateway) attach(ctx context.Context, s *subscription, afterSeq uint64, replay bool) error {
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
	stored := uint64(0)
	if !t.started {
		if err := t.start(ctx); err != nil {
			t.mu.Unlock()
			g.release(t)
			return err
		}
	} else if !replay {
		// EVENT-014: a running tap may not have seen every event stored
		// yet (its republished copies are on their way, or lost and not
		// yet repaired); the registration point is the stream's last
		// event, not the tap's. Read without the lock, so the tap's
		// events do not wait; this attach's ref keeps the tap alive.
		t.mu.Unlock()
		last, err := g.lastSequence(ctx, t.events)
		if err != nil {
			g.release(t)
			return err
		}
		stored = last
		t.mu.Lock()
	}
	if replay && afterSeq < t.lastSeq {
		t.replay(s, afterSeq)
	}
	for g, k := range t.dm {
		s.filter = s.filter.Stitched([]byte(g), k)
	}
	t.subs[s] = struct{}{}
	s.tap.Store(t)
	// Offer skips what the registration point covers: what the tap handed
	// off before, what was stored before, what a resumed SDK already had.
	s.startSeq = max(t.lastSeq, stored, afterSeq)
	t.mu.Unlock()
	return nil
}

// replay offers s the events stored on the client's subject after afterSeq
// up to the tap's last handed-off sequence, from the stream, in order: at
// most MaxReplay; the rest are counted as discarded (EVENT-031). Called with
// t.mu held, so live events wait behind the replay.
func (t *tap) replay(s *subscription, afterSeq uint64) {
	only := map[*subscription]struct{}{s: {}}
	read := 0
	t.scan(only, afterSeq+1, t.lastSeq, t.g.cfg.MaxReplay, func(d *bus.Delivered, body []byte) {
		read++
		t.g.metrics.replayed.Inc()
		t.offer(only, d, body)
	})
	t.g.quotas.chargeReplay(s.tenant, read, time.Now())
}

// detach removes s from its tap; the last subscription removes the tap.
// After detach returns no event is offered to s. It is idempotent, since a
// drain and an unsubscribe may end the same subscription at once.
func (g *Gateway) detach(s *subscription) {
	t := s.tap.Load()
	if t == nil {
		return
	}
	t.mu.Lock()
	_, member := t.subs[s]
	delete(t.subs, s)
	t.mu.Unlock()
	if member {
		g.release(t)
	}
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
	d, err := bus.Decode(m)
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
	t.scan(t.subs, t.lastSeq+1, upTo, g.cfg.MaxRepair, func(d *bus.Delivered, body []byte) {
		g.metrics.repaired.Inc()
		t.dispatch(d, body)
	})
	// What was not handed off is counted; it is not read again.
	t.lastSeq = max(t.lastSeq, upTo)
}

// fetchBatch is how many events one direct get asks for.
const fetchBatch = 256

// scan reads the events stored on the client's subject from sequence from up
// to and including upTo, in batches of direct gets, in order, for subs. The
// first limit events go to each, which hands them off; every later one is
// read only to count, for each of subs whose filter selects it, one discard
// (EVENT-031: the count is what the filter would have selected). What cannot
// be counted so is reported as an upper bound (see unknown): an event that
// does not decode, and the sequences the stream no longer holds or could not
// be read for.
func (t *tap) scan(subs map[*subscription]struct{}, from, upTo uint64, limit int, each func(*bus.Delivered, []byte)) {
	g := t.g
	if from > upTo {
		return
	}
	lag := lagTally{}
	defer lag.flush()
	last := from - 1
	if first, _, err := g.streamBounds(); err == nil && first > from {
		// Removed from the stream (MaxAge): which of them were this
		// client's is unknown.
		gone := min(first, upTo+1) - from
		t.unknown(lag, subs, gone, min(first, upTo+1)-1, "events removed from the stream")
		last = min(first, upTo+1) - 1
	}
	for passed := 0; last < upTo; {
		msgs, err := g.fetchBatch(t.events, last+1, fetchBatch)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			g.log.Warn("fanout: read the events stream", "err", err)
			break
		}
		for _, m := range msgs {
			seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			if err != nil || seq <= last {
				g.log.Warn("fanout: read the events stream", "err", "answer out of order")
				msgs = nil
				break
			}
			if seq > upTo {
				return
			}
			last = seq
			d, err := bus.Decode(m)
			switch {
			case err != nil:
				g.metrics.undecodable.Inc()
				t.unknown(lag, subs, 1, seq, "stored event does not decode")
			case passed < limit:
				// EVENT-031: what was counted so far goes before this event.
				lag.flush()
				each(&d, m.Data)
			default:
				t.uncounted(lag, subs, &d)
			}
			passed++
		}
		if len(msgs) < fetchBatch {
			break
		}
	}
	if last < upTo {
		// The rest could not be read, or is gone: upTo itself was stored.
		t.unknown(lag, subs, upTo-last, upTo, "events not read from the stream")
	}
}

// lagTally gathers the discards a scan counts between two handoffs, per
// subscription, so each run of them reaches the queue at once: the writer
// cannot hand off a lagged for part of a run while the scan still counts
// the rest (EVENT-031: one lagged for the run).
type lagTally map[*subscription]*lagCount

type lagCount struct {
	exact, bound uint64
	through      uint64 // the stream sequence of the last counted
}

func (l lagTally) add(s *subscription, n, through uint64, atMost bool) {
	c := l[s]
	if c == nil {
		c = &lagCount{}
		l[s] = c
	}
	c.through = max(c.through, through)
	if atMost {
		c.bound += n
	} else {
		c.exact += n
	}
}

// flush counts the gathered discards into each subscription's queue; a run
// with any upper bound in it is an upper bound as a whole.
func (l lagTally) flush() {
	for s, c := range l {
		s.c.discard(s, c.exact+c.bound, c.through, c.bound > 0)
		delete(l, s)
	}
}

// uncounted counts d as discarded for each of subs that would have been
// offered it (EVENT-031).
func (t *tap) uncounted(lag lagTally, subs map[*subscription]struct{}, d *bus.Delivered) {
	if g, ok := d.Event.GroupID(); ok && len(d.ConversationKey) > 0 {
		t.learn(g, d.ConversationKey)
	}
	fe := filter.Describe(&d.Event, d.ConversationKey, d.ReferencesOwn)
	for s := range subs {
		if d.Sequence > s.startSeq && s.filter.Match(&fe) {
			lag.add(s, 1, d.Sequence, false)
		}
	}
}

// unknown counts n stream sequences whose events the gateway could not
// obtain or decode as discards for each of subs, so each hands off a lagged
// before its next event (EVENT-031). Whether they were this client's and
// whether a filter would have selected them is unknown: n is an upper bound,
// and the lagged is marked so.
func (t *tap) unknown(lag lagTally, subs map[*subscription]struct{}, n, through uint64, why string) {
	t.g.metrics.unrepaired.Inc()
	t.g.log.Warn("fanout: events not obtained", "why", why, "sequences", n)
	for s := range subs {
		lag.add(s, n, through, true)
	}
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

// dispatch offers one event to every subscription of the tap.
func (t *tap) dispatch(d *bus.Delivered, body []byte) {
	t.g.metrics.received.Inc()
	t.offer(t.subs, d, body)
}

// offer offers one decoded event to each of subs whose filter selects it
// (EVENT-020). The msgpack body is shared as stored; JSON is encoded once,
// on the first JSON subscriber.
func (t *tap) offer(subs map[*subscription]struct{}, d *bus.Delivered, body []byte) {
	if g, ok := d.Event.GroupID(); ok && len(d.ConversationKey) > 0 {
		t.learn(g, d.ConversationKey)
	}
	if len(subs) == 0 {
		return
	}
	fe := filter.Describe(&d.Event, d.ConversationKey, d.ReferencesOwn)
	ev := &event{seq: d.Sequence, id: d.ID, kind: d.Event.Kind, emitted: d.Time, msgpack: body}
	for s := range subs {
		if d.Sequence <= s.startSeq || !s.filter.Match(&fe) {
			continue // EVENT-014, EVENT-020
		}
		if s.c.enc == wire.JSON && ev.json == nil {
			// One allocation, not one per doubling: the JSON of an event is
			// about twice its msgpack (octets in hex).
			b, err := d.Event.AppendJSON(make([]byte, 0, 2*len(body)+64))
			if err != nil {
				t.g.log.Warn("fanout: encode event", "err", err)
				return
			}
			ev.json = b
		}
		s.c.push(s, ev)
	}
}

// learn records that group is a group of the stitched DM with conversation
// key key, as an event of the group says, and tells every subscription whose
// filter names the group: a DM stitched after a subscription started (the
// group's record had no key then) is matched from then on (EVENT-020).
func (t *tap) learn(group, key []byte) {
	if k, ok := t.dm[string(group)]; ok && bytes.Equal(k, key) {
		return
	}
	if t.dm == nil {
		t.dm = make(map[string][]byte)
	}
	t.dm[string(group)] = bytes.Clone(key)
	for s := range t.subs {
		s.filter = s.filter.Stitched(group, key)
	}
}

// fetchBatch fetches up to n messages stored on subj at or after seq from
// the events stream with one batched direct get.
// jetstream.ErrMsgNotFound when there is none.
func (g *Gateway) fetchBatch(subj string, seq uint64, n int) ([]*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
	defer cancel()
	return bus.NextMsgs(ctx, g.cfg.JetStream, g.cfg.Stream, subj, seq, n)
}

// streamBounds returns the first sequence the events stream still holds and
// its last.
func (g *Gateway) streamBounds() (first, last uint64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.RequestTimeout)
	defer cancel()
	s, err := g.cfg.JetStream.Stream(ctx, g.cfg.Stream)
	if err != nil {
		return 0, 0, fmt.Errorf("stream info: %w", err)
	}
	st := s.CachedInfo().State
	return st.FirstSeq, st.LastSeq, nil
}

// afterStart returns the stream sequence after which the events stored on
// subj at or after start begin, for a subscription that starts from the
// stream: before the first such event, or, when there is none yet, the
// stream's last sequence, read before the search so that nothing stored
// meanwhile is skipped.
func (g *Gateway) afterStart(ctx context.Context, subj string, start time.Time) (uint64, error) {
	_, last, err := g.streamBounds()
	if err != nil {
		return 0, err
	}
	m, err := bus.DirectGet(ctx, g.cfg.JetStream, g.cfg.Stream, bus.DirectRequest{NextBySubject: subj, StartTime: start})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return last, nil
	}
	if err != nil {
		return 0, err
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil || seq == 0 {
		return 0, errors.New("direct get: answer without a sequence")
	}
	return seq - 1, nil
}

// lastSequence returns the stream sequence of the last message stored on
// subj, or 0 when there is none.
func (g *Gateway) lastSequence(ctx context.Context, subj string) (uint64, error) {
	m, err := bus.DirectGet(ctx, g.cfg.JetStream, g.cfg.Stream, bus.DirectRequest{LastBySubject: subj})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return 0, errors.New("direct get: answer without a sequence")
	}
	return seq, nil
}
