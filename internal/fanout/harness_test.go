package fanout

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var secret = []byte("0123456789abcdef0123456789abcdef-fanout-tests")

const (
	tenantA = "tenant-a"
	tenantB = "tenant-b"
	client1 = "c1c1"
	client2 = "c2c2"
)

// env is one embedded NATS server with the fabric's streams, a gateway on
// an httptest server, and a publisher.
type env struct {
	t   *testing.T
	ctx context.Context
	ns  *natsserver.Server
	nc  *nats.Conn // the gateway's connection
	pub *nats.Conn // the publisher's connection
	js  jetstream.JetStream
	g   *Gateway
	srv *httptest.Server
	seq atomic.Uint64
}

func newEnv(t *testing.T, tune ...func(*Config)) *env {
	t.Helper()
	return newEnvNATS(t, nil, tune...)
}

// newEnvNATS is newEnv with options for the gateway's NATS connection.
func newEnvNATS(t *testing.T, gatewayNATS []nats.Option, tune ...func(*Config)) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	ns, err := natsserver.Start(ctx, natsserver.Options{StoreDir: t.TempDir(), Port: natsserver.RandomPort})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	pub, err := ns.Connect(nats.ReconnectWait(20 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	js, err := jetstream.New(pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := streams.Ensure(ctx, js, streams.Config{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range [][2]string{{tenantA, client1}, {tenantA, client2}, {tenantB, client1}, {tenantB, client2}, {"t1", "c1"}, {"t2", "c1"}} {
		hostClient(t, ctx, js, tc[0], tc[1])
	}
	nc, err := ns.Connect(gatewayNATS...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	v, err := auth.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{NATS: nc, Verifier: v, PingInterval: time.Second}
	for _, f := range tune {
		f(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- g.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("run: %v", err)
		}
		srv.Close()
	})
	return &env{t: t, ctx: ctx, ns: ns, nc: nc, pub: pub, js: js, g: g, srv: srv}
}

// hostClient stores a record for client of tenant in the clients bucket:
// the gateway refuses subscriptions for clients it holds no record of.
func hostClient(t *testing.T, ctx context.Context, js jetstream.JetStream, tenant, client string) {
	t.Helper()
	kv, err := js.KeyValue(ctx, streams.BucketClients)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, tenant+"."+client, []byte{0x80}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) wsURL() string {
	return "ws" + strings.TrimPrefix(e.srv.URL, "http") + "/v1/events"
}

func token(t testing.TB, tenant string, clients ...string) string {
	t.Helper()
	tok, err := auth.Mint(secret, auth.Claims{Tenant: tenant, Scopes: []auth.Scope{auth.ScopeEvents},
		Clients: clients, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// connect opens an SDK client with a token for tenant naming clients.
func (e *env) connect(tenant string, clients []string, opts ...client.Option) *client.Client {
	e.t.Helper()
	opts = append([]client.Option{client.WithErrorHandler(func(error) {})}, opts...)
	c, err := client.Connect(e.ctx, e.wsURL(), token(e.t, tenant, clients...), opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

// published is one event the test published and the header facts it set.
type published struct {
	ev      schema.ClientEvent
	convKey []byte
	refOwn  bool
	id      string // the event id; one made from the test's name when empty
}

// publish stores one event for tenant/clientID in FABRIC_EVENTS through the
// event bus, as convergence does, and returns its stream sequence.
func (e *env) publish(tenant, clientID string, p published) uint64 {
	e.t.Helper()
	n := e.seq.Add(1)
	if p.id == "" {
		p.id = bus.EventID([]byte(e.t.Name()), []byte(strconv.FormatUint(n, 10)))
	}
	seq, err := bus.Publish(e.ctx, e.js, bus.Event{
		Tenant: tenant, ClientID: clientID, ID: p.id,
		Event: &p.ev, ConversationKey: p.convKey, ReferencesOwn: p.refOwn,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return seq
}

var (
	groupA = schema.Bytes{0xaa, 0x01}
	groupB = schema.Bytes{0xbb, 0x02}
	groupC = schema.Bytes{0xcc, 0x03}
	text   = schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1}
	reply  = schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "reply", VersionMajor: 1}
)

// received builds a message.received whose message id encodes n, so tests
// can tell events apart and check order.
func received(group schema.Bytes, n int, ct *schema.ContentTypeID) schema.ClientEvent {
	return schema.ClientEvent{Kind: schema.KindMessageReceived, MessageReceived: &schema.MessageReceived{
		GroupID: group, MessageID: schema.Bytes(fmt.Appendf(nil, "m%06d", n)), ContentType: ct, SenderInboxID: "inbox"}}
}

func msgNo(ev schema.ClientEvent) int {
	if ev.MessageReceived == nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimPrefix(string(ev.MessageReceived.MessageID), "m"))
	if err != nil {
		return -1
	}
	return n
}

func hmacUpdated() schema.ClientEvent {
	return schema.ClientEvent{Kind: schema.KindHmacKeysUpdated, HmacKeysUpdated: &schema.HmacKeysUpdated{}}
}

var recvKinds = []schema.EventKind{schema.KindMessageReceived}

// next reads one event with a deadline.
func next(t *testing.T, s *client.Subscription) schema.ClientEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("next: %v", err)
	}
	return ev
}

// rawConn is a WebSocket speaking the JSON subprotocol without the SDK, so a
// test controls credit.
type rawConn struct {
	t  *testing.T
	ws *websocket.Conn
}

func (e *env) raw(tok string) *rawConn {
	e.t.Helper()
	ws, _, err := websocket.Dial(e.ctx, e.wsURL(), &websocket.DialOptions{
		HTTPHeader:   map[string][]string{"Authorization": {"Bearer " + tok}},
		Subprotocols: []string{wire.SubprotocolJSON},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	ws.SetReadLimit(1 << 20)
	e.t.Cleanup(func() { _ = ws.CloseNow() })
	return &rawConn{t: e.t, ws: ws}
}

func (r *rawConn) send(f wire.Frame) {
	r.t.Helper()
	if err := r.ws.Write(context.Background(), websocket.MessageText, wire.Append(wire.JSON, nil, &f)); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawConn) sendRaw(b []byte) {
	r.t.Helper()
	if err := r.ws.Write(context.Background(), websocket.MessageText, b); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawConn) read() wire.Frame {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, b, err := r.ws.Read(ctx)
	if err != nil {
		r.t.Fatalf("read: %v", err)
	}
	f, err := wire.Decode(wire.JSON, b)
	if err != nil {
		r.t.Fatalf("decode %q: %v", b, err)
	}
	return f
}

// subscribe subscribes and returns the gateway's subscription id.
func (r *rawConn) subscribe(id uint64, clientID string, f schema.EventFilter) uint64 {
	r.t.Helper()
	r.send(wire.Frame{Op: wire.OpSubscribe, ID: id, ClientID: clientID, Filter: &f})
	got := r.read()
	if got.Op != wire.OpSubscribed || got.ID != id {
		r.t.Fatalf("want subscribed, got %+v", got)
	}
	return got.Sub
}

func decodeJSONEvent(t *testing.T, b []byte) schema.ClientEvent {
	t.Helper()
	var ev schema.ClientEvent
	if err := ev.UnmarshalJSON(b); err != nil {
		t.Fatalf("event %q: %v", b, err)
	}
	return ev
}

func jsonOpt() client.Option { return client.WithJSON() }

// held sums what the gateway counts against the bound for every
// subscription of a client: a test waits on it for credit to come back.
func (e *env) held(tenant, clientID string) int {
	e.g.tapsMu.Lock()
	t := e.g.taps["fabric.live."+tenant+"."+clientID]
	e.g.tapsMu.Unlock()
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for s := range t.subs {
		s.c.mu.Lock()
		n += s.q.Held()
		s.c.mu.Unlock()
	}
	return n
}

// cutTap removes the core subscription of a client's tap, so the events
// stored from now on reach the gateway only as a gap: their republished
// copies are lost, as republishing is at most once.
func (e *env) cutTap(tenant, clientID string) *tap {
	e.t.Helper()
	e.g.tapsMu.Lock()
	tp := e.g.taps["fabric.live."+tenant+"."+clientID]
	e.g.tapsMu.Unlock()
	if tp == nil {
		e.t.Fatal("no tap")
	}
	tp.mu.Lock()
	err := tp.nsub.Unsubscribe()
	tp.mu.Unlock()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	return tp
}

// restoreTap subscribes a cut tap again; the next event reveals the gap.
func (e *env) restoreTap(tp *tap) {
	e.t.Helper()
	tp.mu.Lock()
	nsub, err := e.nc.Subscribe(tp.live, tp.onMsg)
	tp.nsub = nsub
	tp.mu.Unlock()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
}

// sseStatus opens an SSE request and returns its status, closing it.
func sseStatus(t *testing.T, e *env, path, tok string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, e.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// abortConnections aborts every connection of the gateway, as a network
// failure would.
func (e *env) abortConnections() {
	e.g.connsMu.Lock()
	defer e.g.connsMu.Unlock()
	for cn := range e.g.conns {
		cn.abort()
	}
}

// dropConnections aborts every connection of the gateway and waits until
// none is left.
func (e *env) dropConnections(t *testing.T) {
	t.Helper()
	e.abortConnections()
	eventually.True(t, "the connections to go", func() bool {
		e.g.connsMu.Lock()
		defer e.g.connsMu.Unlock()
		return len(e.g.conns) == 0
	})
}
