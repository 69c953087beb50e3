package fanout

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/fanout/filter"
	"github.com/fabric-mls/fabric/internal/fanout/queue"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// BenchmarkOffer measures handing one event to every subscription of a
// client: filter, queue, signal the writer. The event is decoded and encoded
// once whatever the number of subscriptions; half the subscriptions are JSON.
func BenchmarkOffer(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			m, err := newMetrics(prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			g := &Gateway{cfg: Config{QueueCapacity: queue.DefaultCapacity}, metrics: m}
			t := &tap{g: g, subs: make(map[*subscription]struct{})}
			f, err := filter.Compile(schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}}, nil)
			if err != nil {
				b.Fatal(err)
			}
			var conns []*conn
			for i := range n {
				enc := wire.Msgpack
				if i%2 == 1 {
					enc = wire.JSON
				}
				c := newConn(g, enc, false, auth.Claims{}, nil)
				s := c.newSubscription(tenantA, client1, f, 0)
				c.announce(s, nil)
				t.subs[s] = struct{}{}
				conns = append(conns, c)
			}
			d := bus.Delivered{Sequence: 1, Time: time.Now(), Event: received(groupA, 1, &text)}
			body, err := d.Event.MarshalMsgpack()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				t.offer(t.subs, &d, body)
				// Drain as the writers would, so the queues never fill.
				for _, c := range conns {
					c.mu.Lock()
					for _, s := range c.subs {
						s.q.Pop()
						_ = s.q.Credit(1)
					}
					c.ready = c.ready[:0]
					for _, s := range c.subs {
						s.inReady = false
					}
					c.mu.Unlock()
					select {
					case <-c.wake:
					default:
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/handoff")
		})
	}
}

// BenchmarkTapOnMsg measures the tap's handling of one republished
// message.received with a content type, as the load command stores them,
// for one subscription in msgpack or JSON: decode, filter, encode for JSON,
// queue, wake the writer. nats.go's parsing of the message is not in it.
func BenchmarkTapOnMsg(b *testing.B) {
	for _, enc := range []wire.Encoding{wire.Msgpack, wire.JSON} {
		b.Run(enc.Subprotocol(), func(b *testing.B) { benchTapOnMsg(b, enc) })
	}
}

func benchTapOnMsg(b *testing.B, enc wire.Encoding) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	g := &Gateway{cfg: Config{QueueCapacity: queue.DefaultCapacity}, metrics: m}
	t := &tap{g: g, started: true, subs: make(map[*subscription]struct{})}
	f, err := filter.Compile(schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	c := newConn(g, enc, false, auth.Claims{}, nil)
	s := c.newSubscription(tenantA, client1, f, 0)
	c.announce(s, nil)
	t.subs[s] = struct{}{}
	ev := received(groupA, 1, &text)
	body, err := ev.MarshalMsgpack()
	if err != nil {
		b.Fatal(err)
	}
	msg := republished(b, body)
	b.ReportAllocs()
	for b.Loop() {
		t.lastSeq = 3 // the message's Nats-Last-Sequence: no gap to repair
		t.onMsg(msg)
		c.mu.Lock()
		if _, ok := s.q.Pop(); !ok {
			b.Fatal("event not queued")
		}
		_ = s.q.Credit(1)
		c.ready, s.inReady = c.ready[:0], false
		c.mu.Unlock()
		select {
		case <-c.wake:
		default:
		}
	}
}
