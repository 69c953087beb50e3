package fanout

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// A real gap: the tap's core subscription is removed while events are
// stored (their republished copies reach nobody), then restored. The next
// republished event's Nats-Last-Sequence reveals the gap, and the gateway
// fetches the missed events from the stream and hands them off first, in
// order (EVENT-015).
func TestGapRepairedFromStream(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1})
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	if n := msgNo(next(t, s)); n != 1 {
		t.Fatalf("got %d", n)
	}

	tp := e.cutTap(tenantA, client1)
	e.publish(tenantA, client1, published{ev: received(groupA, 2, nil)})
	e.publish(tenantA, client2, published{ev: received(groupA, 100, nil)}) // another subject in between
	e.publish(tenantA, client1, published{ev: received(groupA, 3, nil)})
	e.publish(tenantA, client1, published{ev: received(groupA, 4, nil)})
	e.restoreTap(tp)
	e.publish(tenantA, client1, published{ev: received(groupA, 5, nil)})
	for want := 2; want <= 5; want++ {
		if n := msgNo(next(t, s)); n != want {
			t.Fatalf("got %d, want %d", n, want)
		}
	}
	if got := testutil.ToFloat64(e.g.metrics.repaired); got != 3 {
		t.Fatalf("repaired %v events, want 3", got)
	}
	if got := testutil.ToFloat64(e.g.metrics.gaps); got != 1 {
		t.Fatalf("%v gaps, want 1", got)
	}
}

// After a transient disconnect the SDK reconnects and resumes: the events
// stored meanwhile are replayed from the stream, nothing is lost and nothing
// is handed off twice.
func TestReconnectResumes(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1}, client.WithBackoff(500*time.Millisecond, time.Second))
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	e.publish(tenantA, client1, published{ev: received(groupA, 2, nil)})
	if n := msgNo(next(t, s)); n != 1 {
		t.Fatalf("got %d", n)
	}
	// Event 2 is sent, not yet handed off, when the connection drops.
	eventually.True(t, "event 2 to be sent", func() bool { return e.held(tenantA, client1) == 1 })
	e.dropConnections(t)
	eventually.True(t, "its tap to go", func() bool { return testutil.ToFloat64(e.g.metrics.taps) == 0 })
	e.publish(tenantA, client1, published{ev: received(groupA, 3, nil)})
	e.publish(tenantA, client1, published{ev: received(groupA, 4, nil)})
	eventually.True(t, "the SDK to reconnect and resubscribe", func() bool {
		return testutil.ToFloat64(e.g.metrics.taps) == 1
	})
	e.publish(tenantA, client1, published{ev: received(groupA, 5, nil)})
	for want := 2; want <= 5; want++ {
		if n := msgNo(next(t, s)); n != want {
			t.Fatalf("got %d, want %d", n, want)
		}
	}
	// 3 and 4 were stored while no tap existed: only the replay can bring
	// them. 2 is replayed too when the drop caught it before the SDK read it.
	if got := testutil.ToFloat64(e.g.metrics.replayed); got != 2 && got != 3 {
		t.Fatalf("replayed %v events, want 2 or 3", got)
	}
	// The bound still adds up: everything handed off was credited.
	eventually.True(t, "credit to settle", func() bool { return e.held(tenantA, client1) == 0 })
}

// Protocol limits answer with clear error frames and keep the connection.
func TestProtocolErrors(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxSubscriptions = 1; c.MaxFrameBytes = 512 })
	r := e.raw(token(t, tenantA, client1))
	expect := func(code string, id uint64) {
		t.Helper()
		f := r.read()
		if f.Op != wire.OpError || f.Code != code || f.ID != id || f.Message == "" {
			t.Fatalf("want error %s for %d, got %+v", code, id, f)
		}
	}
	r.sendRaw([]byte(`{"op":"dance"}`))
	expect(wire.CodeUnknownOp, 0)
	r.sendRaw([]byte(`{"op":`))
	expect(wire.CodeMalformedFrame, 0)
	r.sendRaw([]byte(`{"op":"subscribe","id":7,"client_id":"c1c1","filter":{"kinds":["no.such"]}}`))
	expect(wire.CodeInvalidFilter, 7)
	r.sendRaw([]byte(`{"op":"subscribe","id":8,"client_id":"c1c1"}`))
	expect(wire.CodeInvalidFilter, 8)
	r.sendRaw([]byte(`{"op":"subscribe","id":9,"client_id":"` + strings.Repeat("ab", 400) + `"}`))
	expect(wire.CodeFrameTooLarge, 0)
	if err := r.ws.Write(context.Background(), websocket.MessageBinary, []byte{0x80}); err != nil {
		t.Fatal(err)
	}
	expect(wire.CodeMalformedFrame, 0)
	sub := r.subscribe(10, client1, schema.EventFilter{Kinds: recvKinds})
	r.send(wire.Frame{Op: wire.OpSubscribe, ID: 11, ClientID: client1, Filter: &schema.EventFilter{Kinds: recvKinds}})
	expect(wire.CodeTooManySubscriptions, 11)
	r.send(wire.Frame{Op: wire.OpCredit, Sub: sub, N: 1})
	expect(wire.CodeBadCredit, 0)
	r.send(wire.Frame{Op: wire.OpUnsubscribe, Sub: 99})
	expect(wire.CodeUnknownSubscription, 0)
	r.send(wire.Frame{Op: wire.OpUnsubscribe, Sub: sub})
	if f := r.read(); f.Op != wire.OpEnded || f.Reason != wire.ReasonUnsubscribed {
		t.Fatalf("want ended, got %+v", f)
	}
}

// The handshake refuses an Authorization header without a bearer token
// (401) and a request offering no known subprotocol (400); a request
// without the header is upgraded to send its connect frame
// (TestConnectFrameRefusals).
func TestHandshakeRefusals(t *testing.T) {
	e := newEnv(t)
	dial := func(tok string, protos ...string) int {
		h := http.Header{}
		if tok != "" {
			h.Set("Authorization", "Bearer "+tok)
		}
		ws, resp, err := websocket.Dial(e.ctx, e.wsURL(), &websocket.DialOptions{HTTPHeader: h, Subprotocols: protos})
		if err == nil {
			_ = ws.CloseNow()
			return 101
		}
		return resp.StatusCode
	}
	if got := dial("", wire.SubprotocolJSON); got != 101 {
		t.Errorf("no header: %d, want the upgrade that awaits the connect frame", got)
	}
	ws, resp, err := websocket.Dial(e.ctx, e.wsURL(), &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Basic YTpi"}}, Subprotocols: []string{wire.SubprotocolJSON}})
	if err == nil {
		_ = ws.CloseNow()
		t.Errorf("Basic credentials upgraded")
	} else if resp.StatusCode != 401 {
		t.Errorf("Basic credentials: %d, want 401", resp.StatusCode)
	}
	if got := dial(token(t, tenantA, client1), "chat"); got != 400 {
		t.Errorf("unknown subprotocol: %d", got)
	}
	if got := dial(token(t, tenantA, client1), wire.SubprotocolMsgpack); got != 101 {
		t.Errorf("valid: %d", got)
	}
}

// Draining ends every subscription with reason shutdown before the
// connection closes.
func TestShutdownEndsSubscriptions(t *testing.T) {
	e := newEnv(t)
	r := e.raw(token(t, tenantA, client1))
	sub := r.subscribe(1, client1, schema.EventFilter{Kinds: recvKinds})
	c := e.connect(tenantA, []string{client1}, client.WithoutReconnect())
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- e.g.Shutdown(ctx) }()
	if f := r.read(); f.Op != wire.OpEnded || f.Sub != sub || f.Reason != wire.ReasonShutdown {
		t.Fatalf("want ended shutdown, got %+v", f)
	}
	// Reading on answers the gateway's close.
	if _, _, err := r.ws.Read(ctx); websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("want close going away, got %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(ctx); !errors.Is(err, client.ErrEnded) {
		t.Fatalf("SDK subscription after shutdown: %v", err)
	}
	if code := getStatus(t, e, "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz while draining: %d", code)
	}
}

// SSE: the subscription is registered before the first byte of the stream,
// and events arrive as event: <kind> with their JSON.
func TestSSE(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.AllowQueryToken = true })
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet,
		e.srv.URL+"/v1/tenants/"+tenantA+"/clients/"+client1+"/events?kinds=message.received&group_ids="+groupA.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token(t, tenantA, client1))
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(resp.Body)
	line := func() string {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSuffix(l, "\n")
	}
	if l := line(); l != ": subscribed" {
		t.Fatalf("first line %q", l)
	}
	line()
	e.publish(tenantA, client1, published{ev: received(groupC, 1, nil)}) // filtered out
	e.publish(tenantA, client1, published{ev: received(groupA, 2, &text)})
	var kind, data string
	for kind == "" || data == "" {
		l := line()
		if v, ok := strings.CutPrefix(l, "event: "); ok {
			kind = v
		}
		if v, ok := strings.CutPrefix(l, "data: "); ok {
			data = v
		}
	}
	if kind != string(schema.KindMessageReceived) {
		t.Fatalf("event %q", kind)
	}
	if ev := decodeJSONEvent(t, []byte(data)); msgNo(ev) != 2 {
		t.Fatalf("got %+v", ev)
	}
	// A browser's EventSource passes the token in the query.
	path := "/v1/tenants/" + tenantA + "/clients/" + client1 + "/events?kinds=message.received&access_token="
	if code := sseStatus(t, e, path+token(t, tenantA, client1), ""); code != 200 {
		t.Fatalf("SSE with access_token: %d", code)
	}
	if code := sseStatus(t, e, path+"bogus", ""); code != 401 {
		t.Fatalf("SSE with a bad access_token: %d", code)
	}
}

func TestOpsEndpoints(t *testing.T) {
	e := newEnv(t)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200} {
		if got := getStatus(t, e, path); got != want {
			t.Errorf("%s: %d", path, got)
		}
	}
	resp, err := e.srv.Client().Get(e.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b := new(strings.Builder)
	if _, err := bufio.NewReader(resp.Body).WriteTo(b); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"fabric_fanout_subscriptions", "fabric_fanout_queue_depth", "fabric_fanout_handoff_latency_seconds"} {
		if !strings.Contains(b.String(), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func getStatus(t *testing.T, e *env, path string) int {
	t.Helper()
	resp, err := e.srv.Client().Get(e.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A connection lives no longer than its token: its subscriptions end with
// reason token_expired; with a token function the SDK resumes them on a new
// connection without losing an event.
func TestTokenExpiry(t *testing.T) {
	e := newEnv(t)
	short := func() string {
		tok, err := auth.Mint(secret, auth.Claims{Tenant: tenantA, Scopes: []auth.Scope{auth.ScopeEvents},
			Clients: []string{client1}, ExpiresAt: time.Now().Add(1500 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	r := e.raw(short())
	sub := r.subscribe(1, client1, schema.EventFilter{Kinds: recvKinds})

	c := e.connect(tenantA, []string{client1}, client.WithBackoff(50*time.Millisecond, 200*time.Millisecond),
		client.WithTokenFunc(func(context.Context) (string, error) { return short(), nil }))
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	if f := r.read(); f.Op != wire.OpEvent {
		t.Fatalf("got %+v", f)
	}
	if f := r.read(); f.Op != wire.OpEnded || f.Sub != sub || f.Reason != wire.ReasonTokenExpired {
		t.Fatalf("want ended token_expired, got %+v", f)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 2, nil)})
	for want := 1; want <= 2; want++ {
		if n := msgNo(next(t, s)); n != want {
			t.Fatalf("got %d, want %d", n, want)
		}
	}
	if s.Err() != nil {
		t.Fatalf("subscription ended: %v", s.Err())
	}
}

// Run serves until its context ends, then drains.
func TestRunServesUntilCancelled(t *testing.T) {
	e := newEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	v, err := auth.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{NATS: e.nc, Verifier: v, Listen: addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	eventually.True(t, "the listener", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// When the gateway's NATS connection comes back after the server restarts,
// events republished while it was away are lost and no later event may come
// to reveal the gap: the gateway compares every tap with the stream and
// repairs it.
func TestHealAfterNATSReconnect(t *testing.T) {
	var blocked atomic.Bool
	dialer := &blockingDialer{blocked: &blocked}
	e := newEnvNATS(t, []nats.Option{nats.SetCustomDialer(dialer), nats.ReconnectWait(20 * time.Millisecond)},
		func(c *Config) { c.HealInterval = 20 * time.Millisecond })
	c := e.connect(tenantA, []string{client1})
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	if n := msgNo(next(t, s)); n != 1 {
		t.Fatalf("got %d", n)
	}
	// The gateway cannot reconnect until the event below is stored, so its
	// republished copy reaches nobody.
	blocked.Store(true)
	e.ns.Shutdown()
	if err := e.ns.Restart(e.ctx); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the publisher to reconnect", e.pub.IsConnected)
	e.publish(tenantA, client1, published{ev: received(groupA, 2, nil)})
	blocked.Store(false)
	if n := msgNo(next(t, s)); n != 2 {
		t.Fatalf("got %d, want 2", n)
	}
	if got := testutil.ToFloat64(e.g.metrics.repaired); got != 1 {
		t.Fatalf("repaired %v events, want 1", got)
	}
}

// blockingDialer refuses to dial while blocked.
type blockingDialer struct {
	blocked *atomic.Bool
	d       net.Dialer
}

func (b *blockingDialer) Dial(network, address string) (net.Conn, error) {
	if b.blocked.Load() {
		return nil, errors.New("dial blocked by the test")
	}
	return b.d.Dial(network, address)
}

// Reconnects under load: the connection drops three times while events
// flow. Every event is handed off once, in order, or counted by a lagged;
// the SDK's credit after each resume never exceeds what the gateway lent
// (no bad_credit), and the bound settles back to zero. Both forms: the
// iterator, and a callback whose running event counts against the bound;
// and an app that reads nothing until the end, so the bound overflows
// across resumes and every event is either handed off or counted lagged.
func TestReconnectsUnderLoad_EVENT015_EVENT030_EVENT031(t *testing.T) {
	for _, form := range []string{"iterator", "callback", "stalled"} {
		t.Run(form, func(t *testing.T) { reconnectsUnderLoad(t, form == "callback", form == "stalled") })
	}
}

func reconnectsUnderLoad(t *testing.T, callback, stalled bool) {
	e := newEnv(t)
	var protoErrs atomic.Int32
	c := e.connect(tenantA, []string{client1}, client.WithBackoff(10*time.Millisecond, 50*time.Millisecond),
		client.WithErrorHandler(func(err error) {
			var ge *client.GatewayError
			if errors.As(err, &ge) {
				protoErrs.Add(1)
			}
		}))
	const total = 3000
	events := make(chan schema.ClientEvent, total+16)
	var s *client.Subscription
	var err error
	f := schema.EventFilter{Kinds: recvKinds}
	if callback {
		s, err = c.SubscribeFunc(context.Background(), client1, f, func(_ context.Context, ev schema.ClientEvent) error {
			events <- ev
			return nil
		})
	} else {
		s, err = c.Subscribe(context.Background(), client1, f)
	}
	if err != nil {
		t.Fatal(err)
	}
	nextEvent := func() schema.ClientEvent {
		if !callback {
			return next(t, s)
		}
		select {
		case ev := <-events:
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no event")
		}
		return schema.ClientEvent{}
	}
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := range total {
			e.publish(tenantA, client1, published{ev: received(groupA, i, nil)})
			if i%750 == 374 {
				e.abortConnections()
			}
		}
	}()
	if stalled {
		<-pubDone
	}
	prev, seen := -1, 0
	var lagged uint64
	for seen+int(lagged) < total {
		ev := nextEvent()
		if ev.Kind == schema.KindLagged {
			lagged += ev.Lagged.Discarded
			continue
		}
		n := msgNo(ev)
		if n <= prev {
			t.Fatalf("event %d after %d: duplicate or out of order", n, prev)
		}
		if n != prev+1 && lagged == 0 {
			t.Fatalf("event %d after %d with nothing reported lagged", n, prev)
		}
		prev = n
		seen++
	}
	<-pubDone
	if protoErrs.Load() != 0 {
		t.Fatalf("%d error frames from the gateway", protoErrs.Load())
	}
	if seen+int(lagged) != total {
		t.Fatalf("handed off %d and lagged %d of %d", seen, lagged, total)
	}
	eventually.True(t, "the bound to settle", func() bool { return e.held(tenantA, client1) == 0 })
	t.Logf("handed off %d, lagged %d, replayed %v", seen, lagged, testutil.ToFloat64(e.g.metrics.replayed))
	_ = s.Close()
	<-s.Done()
}

// A stored event that does not decode cannot be handed off; it is reported
// once as a lagged before the next event (EVENT-031), not skipped silently
// and not reported again on every later event.
func TestUndecodableEventReportedOnce_EVENT031(t *testing.T) {
	e := newEnv(t)
	c := e.connect(tenantA, []string{client1})
	s, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds})
	if err != nil {
		t.Fatal(err)
	}
	bad := nats.NewMsg("fabric.ev." + tenantA + "." + client1)
	bad.Header.Set(jetstream.MsgIDHeader, strings.Repeat("ab", 32))
	bad.Data = []byte{0xc1} // never valid msgpack
	if _, err := e.js.PublishMsg(e.ctx, bad); err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	e.publish(tenantA, client1, published{ev: received(groupA, 2, nil)})
	ev := next(t, s)
	if ev.Kind != schema.KindLagged || ev.Lagged.Discarded != 1 {
		t.Fatalf("want lagged{1}, got %+v", ev)
	}
	for want := 1; want <= 2; want++ {
		if n := msgNo(next(t, s)); n != want {
			t.Fatalf("got %d, want %d", n, want)
		}
	}
}

// Subscribing, unsubscribing and a drain racing each other leave nothing
// behind: every tap is removed and the gauges return to zero.
func TestConcurrentSubscribeUnsubscribeDrain(t *testing.T) {
	e := newEnv(t)
	var wg sync.WaitGroup
	for i := range 4 {
		c := e.connect(tenantA, []string{client1, client2}, client.WithoutReconnect())
		wg.Go(func() {
			for j := 0; j < 30; j++ {
				id := client1
				if (i+j)%2 == 0 {
					id = client2
				}
				s, err := c.Subscribe(context.Background(), id, schema.EventFilter{Kinds: recvKinds})
				if err != nil {
					return // refused once the drain began
				}
				if j%3 != 0 {
					_ = s.Close()
				}
			}
		})
	}
	time.Sleep(10 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	eventually.True(t, "every tap to go", func() bool {
		e.g.tapsMu.Lock()
		defer e.g.tapsMu.Unlock()
		return len(e.g.taps) == 0 && testutil.ToFloat64(e.g.metrics.taps) == 0 &&
			testutil.ToFloat64(e.g.metrics.subscriptions) == 0
	})
}

// A peer that stops reading does not answer pings: the keepalive closes its
// connection and releases its subscriptions.
func TestKeepaliveClosesDeadPeer(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.PingInterval = 50 * time.Millisecond; c.WriteTimeout = 200 * time.Millisecond })
	r := e.raw(token(t, tenantA, client1))
	r.subscribe(1, client1, schema.EventFilter{Kinds: recvKinds})
	// The raw client reads nothing more, so it never answers a ping.
	eventually.True(t, "the dead peer's connection to close", func() bool {
		return testutil.ToFloat64(e.g.metrics.connections.WithLabelValues("websocket")) == 0 &&
			testutil.ToFloat64(e.g.metrics.taps) == 0
	})
}

// An EventSource that reconnects with Last-Event-ID resumes after that
// event: what was stored meanwhile is replayed first.
func TestSSEResumesFromLastEventID(t *testing.T) {
	e := newEnv(t)
	first := e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	e.publish(tenantA, client1, published{ev: received(groupA, 2, nil)})
	e.publish(tenantA, client1, published{ev: received(groupA, 3, nil)})
	// A live subscription keeps the tap's position past event 3.
	c := e.connect(tenantA, []string{client1})
	if _, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds}); err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet,
		e.srv.URL+"/v1/tenants/"+tenantA+"/clients/"+client1+"/events?kinds=message.received", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token(t, tenantA, client1))
	req.Header.Set("Last-Event-ID", strconv.FormatUint(first, 10))
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var got []int
	for len(got) < 2 {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "data: "); ok {
			got = append(got, msgNo(decodeJSONEvent(t, []byte(v))))
		}
	}
	if got[0] != 2 || got[1] != 3 {
		t.Fatalf("resumed with %v, want [2 3]", got)
	}
}

// readEvent reads one event frame and decodes its event.
func (r *rawConn) readEvent() (wire.Frame, schema.ClientEvent) {
	r.t.Helper()
	f := r.read()
	if f.Op != wire.OpEvent {
		r.t.Fatalf("want an event frame, got %+v", f)
	}
	return f, decodeJSONEvent(r.t, f.Event)
}

// A gap larger than the repair limit: the events past it are not handed off
// but still read, and the lagged counts exactly those the subscription's
// filter would have selected, not 1 (EVENT-031).
func TestUnrepairableGapLaggedCount_EVENT031(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxRepair = 3 })
	r := e.raw(token(t, tenantA, client1))
	r.subscribe(1, client1, schema.EventFilter{Kinds: recvKinds, GroupIDs: []schema.Bytes{groupA}})
	tp := e.cutTap(tenantA, client1)
	for i := range 10 { // A0 B1 A2 B3 … B9: events 0-2 are repaired, 3-9 are past the limit
		g := groupA
		if i%2 == 1 {
			g = groupB
		}
		e.publish(tenantA, client1, published{ev: received(g, i, nil)})
	}
	e.restoreTap(tp)
	e.publish(tenantA, client1, published{ev: received(groupA, 10, nil)})
	for _, want := range []int{0, 2} {
		if _, ev := r.readEvent(); msgNo(ev) != want {
			t.Fatalf("got %+v, want event %d", ev, want)
		}
	}
	f, ev := r.readEvent()
	if ev.Kind != schema.KindLagged || ev.Lagged.Discarded != 3 || f.AtMost {
		t.Fatalf("got %+v (at_most %v), want lagged {3}: A4, A6, A8", ev, f.AtMost)
	}
	if _, ev := r.readEvent(); msgNo(ev) != 10 {
		t.Fatalf("got %+v, want event 10", ev)
	}
}

// Resuming after events the stream no longer holds (removed by age, here by
// a purge): which of the removed sequences were the client's is unknown, so
// the lagged counts the removed sequences as an upper bound and says so
// with at_most (EVENT-031, docs/wire-formats.md).
func TestResumePastRemovedEventsLaggedAtMost_EVENT031(t *testing.T) {
	e := newEnv(t)
	after := e.publish(tenantA, client1, published{ev: received(groupA, 1, nil)})
	e.publish(tenantA, client2, published{ev: received(groupA, 100, nil)})
	e.publish(tenantA, client1, published{ev: received(groupA, 2, nil)})
	kept := e.publish(tenantA, client1, published{ev: received(groupA, 3, nil)})
	e.publish(tenantA, client1, published{ev: received(groupA, 4, nil)})
	st, err := e.js.Stream(e.ctx, streams.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(e.ctx, jetstream.WithPurgeSequence(kept)); err != nil {
		t.Fatal(err)
	}
	r := e.raw(token(t, tenantA, client1))
	all := schema.EventFilter{Kinds: recvKinds}
	r.send(wire.Frame{Op: wire.OpSubscribe, ID: 1, ClientID: client1, Filter: &all, AfterSeq: after})
	if f := r.read(); f.Op != wire.OpSubscribed {
		t.Fatalf("resume: %+v", f)
	}
	f, ev := r.readEvent()
	if ev.Kind != schema.KindLagged || ev.Lagged.Discarded != kept-after-1 || !f.AtMost {
		t.Fatalf("got %+v (at_most %v), want lagged {%d} at most", ev, f.AtMost, kept-after-1)
	}
	for _, want := range []int{3, 4} {
		if _, ev := r.readEvent(); msgNo(ev) != want {
			t.Fatalf("got %+v, want event %d", ev, want)
		}
	}
}
