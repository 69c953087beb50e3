package fanout

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/fanout/filter"
	"github.com/fabric-mls/fabric/internal/fanout/queue"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// subscription is one app subscription. Its queue and flags are guarded by
// its connection's mu.
type subscription struct {
	id       uint64
	c        *conn
	tenant   string
	client   string
	filter   *filter.Filter      // once attached, read and replaced under its tap's mu (tap.learn)
	tap      atomic.Pointer[tap] // set by attach; read by detach from any goroutine
	startSeq uint64              // its registration point: events stored up to it are not offered

	q         *queue.Queue[*event]
	announced bool // its subscribed frame is queued; events may follow it
	inReady   bool // it is in c.ready
	ended     bool
}

// sink writes frames to one app connection. Writes come from the
// connection's writer goroutine only.
type sink interface {
	// writeFrame writes one frame, already in the connection's format.
	writeFrame(b []byte) error
	// setDeadline bounds the writes that follow: past t the connection is
	// closed and a blocked write fails. The zero time removes the bound.
	// One deadline per batch costs less than a context per frame.
	setDeadline(t time.Time)
	// ping keeps the connection alive and checks the peer still reads.
	ping(ctx context.Context) error
	// gather holds the frames written until flush, which writes them at
	// once: a batch of frames costs one write, not one per frame (as
	// Centrifugo's writer joins queued messages).
	gather()
	flush() error
}

// conn is one app connection, WebSocket or SSE. Events reach it from taps
// (push); one writer goroutine, owned by the connection's handler, writes
// them, so a slow connection never holds a tap or another connection back
// (EVENT-033).
type conn struct {
	g      *Gateway
	enc    wire.Encoding
	sse    bool
	claims auth.Claims
	out    sink

	// wake (capacity 1) says "look again": something to write, a ping due,
	// or abort. The writer waits on it alone, a cheaper wait per batch
	// than a select over several channels.
	wake    chan struct{}
	aborted atomic.Bool // set by abort: stop writing now
	pingDue atomic.Bool // set by the writer's ping timer

	mu       sync.Mutex
	subs     map[uint64]*subscription
	nextID   uint64
	ready    []*subscription // subscriptions whose queue has an item ready
	rr       int
	control  [][]byte // control frames, written before events
	draining bool     // refuse new subscriptions
	reason   string   // why it drains
	closing  bool     // write the control frames, then close
}

func newConn(g *Gateway, enc wire.Encoding, sse bool, claims auth.Claims, out sink) *conn {
	return &conn{
		g: g, enc: enc, sse: sse, claims: claims, out: out,
		wake: make(chan struct{}, 1),
		subs: make(map[uint64]*subscription),
	}
}

// Transports, the values of the connections metric's label.
const (
	transportWebSocket = "websocket"
	transportSSE       = "sse"
)

func (c *conn) transport() string {
	if c.sse {
		return transportSSE
	}
	return transportWebSocket
}

func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// newSubscription reserves an id and a queue; the subscription is not
// announced until c.announce.
func (c *conn) newSubscription(tenant, client string, f *filter.Filter, held int) *subscription {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID++
	s := &subscription{id: c.nextID, c: c, tenant: tenant, client: client, filter: f,
		q: queue.New(c.g.cfg.QueueCapacity, (*event).sequence)}
	s.q.Hold(held)
	c.subs[s.id] = s
	return s
}

// count reports the connection's live subscriptions.
func (c *conn) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.subs)
}

// announce queues the subscribed frame, after which the subscription's events
// may be written (they always follow it).
func (c *conn) announce(s *subscription, frame []byte) {
	c.mu.Lock()
	if s.ended {
		// Ended by a drain while it was being attached: undo the attach.
		c.mu.Unlock()
		c.g.detach(s)
		return
	}
	if frame != nil {
		c.control = append(c.control, frame)
	}
	s.announced = true
	c.markReady(s)
	draining, reason := c.draining, c.reason
	c.mu.Unlock()
	c.g.metrics.subscriptions.Inc()
	c.signal()
	if draining {
		// Drain began while this subscription was being registered.
		c.end(s, reason)
	}
}

// markReady puts s in the ready list if it has something to pop. c.mu held.
func (c *conn) markReady(s *subscription) {
	if s.announced && !s.ended && !s.inReady && s.q.Ready() {
		c.ready = append(c.ready, s)
		s.inReady = true
	}
}

// push offers ev to s's queue (EVENT-030); called by taps.
func (c *conn) push(s *subscription, ev *event) {
	c.mu.Lock()
	if s.ended {
		c.mu.Unlock()
		return
	}
	before := s.q.TotalDiscarded()
	s.q.Push(ev)
	if n := s.q.TotalDiscarded() - before; n > 0 {
		c.g.metrics.discarded.Add(float64(n))
	}
	depth := s.q.Held()
	wasReady := s.inReady
	c.markReady(s)
	becameReady := !wasReady && s.inReady
	c.mu.Unlock()
	c.g.metrics.queueDepth.Observe(float64(depth))
	if becameReady {
		c.signal()
	}
}

// discard counts n events s will never see, the last at stream sequence
// through; atMost when n is an upper bound.
func (c *conn) discard(s *subscription, n, through uint64, atMost bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.ended {
		return
	}
	before := s.q.TotalDiscarded()
	if atMost {
		s.q.DiscardAtMost(n, through)
	} else {
		s.q.Discard(n, through)
	}
	c.g.metrics.discarded.Add(float64(s.q.TotalDiscarded() - before))
	c.markReady(s)
	c.signal()
}

// credit returns n handoffs of subscription id. ok is false for an unknown
// subscription; err for more credit than was handed off.
func (c *conn) credit(id uint64, n int) (ok bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.subs[id]
	if s == nil {
		return false, nil
	}
	if err := s.q.Credit(n); err != nil {
		return true, err
	}
	c.markReady(s)
	if s.inReady {
		c.signal()
	}
	return true, nil
}

// end ends one subscription: detached from its tap first, so nothing more is
// offered to it, then its queued events are dropped and, when reason is not
// empty, an ended frame is queued.
func (c *conn) end(s *subscription, reason string) bool {
	c.g.detach(s)
	c.mu.Lock()
	if s.ended {
		c.mu.Unlock()
		return false
	}
	s.ended = true
	delete(c.subs, s.id)
	if s.inReady {
		for i, r := range c.ready {
			if r == s {
				c.ready = append(c.ready[:i], c.ready[i+1:]...)
				break
			}
		}
		s.inReady = false
	}
	announced := s.announced
	if reason != "" {
		c.control = append(c.control, c.controlFrame(&wire.Frame{Op: wire.OpEnded, Sub: s.id, Reason: reason}))
	}
	c.mu.Unlock()
	if announced {
		c.g.metrics.subscriptions.Dec()
	}
	c.signal()
	return true
}

// endAll ends every subscription, with an ended frame when reason is set.
func (c *conn) endAll(reason string) {
	c.mu.Lock()
	subs := make([]*subscription, 0, len(c.subs))
	for _, s := range c.subs {
		subs = append(subs, s)
	}
	c.mu.Unlock()
	for _, s := range subs {
		c.end(s, reason)
	}
}

// drain ends every subscription with reason; the writer then writes the
// ended frames and returns, and the handler closes the connection.
func (c *conn) drain(reason string) {
	c.mu.Lock()
	c.draining = true
	c.reason = reason
	c.mu.Unlock()
	c.endAll(reason)
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.signal()
}

// abort makes the writer return at once.
func (c *conn) abort() {
	c.aborted.Store(true)
	c.signal()
}

// maxControl bounds the control frames waiting to be written: a peer that
// sends faster than it reads the answers is cut off, not buffered for.
const maxControl = 1024

// queueError queues an error frame.
func (c *conn) queueError(id uint64, code, msg string) {
	c.g.metrics.protocolErrs.WithLabelValues(code).Inc()
	c.mu.Lock()
	over := len(c.control) >= maxControl
	if !over {
		c.control = append(c.control, c.controlFrame(&wire.Frame{Op: wire.OpError, ID: id, Code: code, Message: msg}))
	}
	c.mu.Unlock()
	if over {
		c.abort()
		return
	}
	c.signal()
}

func (c *conn) controlFrame(f *wire.Frame) []byte {
	if c.sse {
		return appendSSEControl(nil, f)
	}
	return wire.Append(c.enc, nil, f)
}

// popped is one item taken from a subscription's queue for writing.
type popped struct {
	s    *subscription
	item queue.Item[*event]
}

// take moves the queued control frames and up to max events, one per ready
// subscription in turn, out for writing. c.mu held.
func (c *conn) take(batch []popped, max int) ([][]byte, []popped, bool) {
	ctrl := c.control
	c.control = nil
	for len(batch) < max && len(c.ready) > 0 {
		if c.rr >= len(c.ready) {
			c.rr = 0
		}
		s := c.ready[c.rr]
		it, ok := s.q.Pop()
		if !ok {
			s.inReady = false
			c.ready = append(c.ready[:c.rr], c.ready[c.rr+1:]...)
			continue
		}
		batch = append(batch, popped{s: s, item: it})
		c.rr++
	}
	return ctrl, batch, c.closing
}

// writeLoop is the connection's writer. It returns when the connection
// drains, is aborted, ctx ends, or a write fails (the write deadline
// included).
func (c *conn) writeLoop(ctx context.Context) error {
	var (
		buf   []byte
		batch []popped
		ctrl  [][]byte
		drain bool
	)
	stopOnDone := context.AfterFunc(ctx, c.abort)
	defer stopOnDone()
	pinger := time.AfterFunc(c.g.cfg.PingInterval, func() {
		c.pingDue.Store(true)
		c.signal()
	})
	defer pinger.Stop()
	for {
		if c.aborted.Load() {
			if err := ctx.Err(); err != nil {
				return err
			}
			return context.Canceled
		}
		c.mu.Lock()
		ctrl, batch, drain = c.take(batch[:0], defaultWriterBatch)
		c.mu.Unlock()
		if len(ctrl) > 0 || len(batch) > 0 {
			c.out.setDeadline(time.Now().Add(c.g.cfg.WriteTimeout))
			gather := len(ctrl)+len(batch) > 1
			if gather {
				c.out.gather()
			}
			for _, f := range ctrl {
				if err := c.out.writeFrame(f); err != nil {
					return err
				}
			}
			for i := range batch {
				buf = c.eventFrame(buf[:0], &batch[i])
				if err := c.out.writeFrame(buf); err != nil {
					return err
				}
			}
			if gather {
				if err := c.out.flush(); err != nil {
					return err
				}
			}
			for i := range batch {
				c.wrote(&batch[i])
				batch[i] = popped{}
			}
			c.out.setDeadline(time.Time{})
			continue
		}
		if drain {
			return nil
		}
		if c.pingDue.Swap(false) {
			pctx, cancel := context.WithTimeout(ctx, c.g.cfg.WriteTimeout)
			err := c.out.ping(pctx)
			cancel()
			if err != nil {
				return err
			}
			pinger.Reset(c.g.cfg.PingInterval)
			continue
		}
		<-c.wake
	}
}

// eventFrame builds the frame of one popped item in the connection's format.
func (c *conn) eventFrame(buf []byte, p *popped) []byte {
	if c.sse {
		return appendSSEEvent(buf, p.item)
	}
	f := wire.Frame{Op: wire.OpEvent, Sub: p.s.id, AtMost: p.item.AtMost}
	if p.item.Lagged {
		f.Event, f.Seq = wire.AppendLagged(c.enc, nil, p.item.Discarded), p.item.Seq
	} else {
		f.Event, f.Seq, f.EventID = p.item.Value.encoded(c.enc), p.item.Value.seq, p.item.Value.id
	}
	return wire.Append(c.enc, buf, &f)
}

// wrote accounts for a written item. SSE has no credit: the handoff is
// complete when the write is, so its slot is freed at once.
func (c *conn) wrote(p *popped) {
	m := c.g.metrics
	m.handedOff.Inc()
	if p.item.Lagged {
		m.lagged.Inc()
	} else if !p.item.Value.emitted.IsZero() {
		m.latency.Observe(time.Since(p.item.Value.emitted).Seconds())
	}
	if c.sse {
		c.mu.Lock()
		if !p.s.ended {
			_ = p.s.q.Credit(1)
			c.markReady(p.s)
		}
		c.mu.Unlock()
	}
}
