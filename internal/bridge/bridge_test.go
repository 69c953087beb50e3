package bridge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// destination is a fake transport endpoint: answer decides each post's
// status from the payloads it carries; what it answers 200 is recorded.
type destination struct {
	*httptest.Server
	tenant   string
	mu       sync.Mutex
	posts    int
	accepted []string // payloads, in the order answered 200
	answer   func(post int, payloads []string) (status int, code string)
}

func newDestination(t *testing.T, answer func(post int, payloads []string) (int, string)) *destination {
	d := &destination{tenant: "dev", answer: answer}
	d.Server = httptest.NewServer(http.HandlerFunc(d.serve))
	t.Cleanup(d.Close)
	return d
}

func (d *destination) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/tenants/"+d.tenant+"/transport" || r.Header.Get("Authorization") != "Bearer tok" || r.Header.Get("Content-Type") != "application/msgpack" {
		http.Error(w, "bad request line", http.StatusTeapot)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var batch map[string][]msgpack.RawMessage
	if err := msgpack.Unmarshal(body, &batch); err != nil || len(batch) != 1 {
		http.Error(w, "not a batch", http.StatusTeapot)
		return
	}
	var payloads []string
	for _, raw := range batch["messages"] {
		var tm schema.TransportMessage
		if err := tm.UnmarshalMsgpack(raw); err != nil {
			http.Error(w, "not a transport message", http.StatusTeapot)
			return
		}
		payloads = append(payloads, string(tm.Payload))
	}
	d.mu.Lock()
	d.posts++
	status, code := d.answer(d.posts, payloads)
	if status == http.StatusOK {
		d.accepted = append(d.accepted, payloads...)
	}
	d.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	if status != http.StatusOK {
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": "refused by the test"}})
		return
	}
	results := make([]result, len(payloads))
	for i, p := range payloads {
		id := sha256.Sum256([]byte(p))
		results[i] = result{MessageID: id[:], Status: schema.OutcomeStatus("queued")}
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
}

func (d *destination) got() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.accepted)
}

// publishOutbound stores payloads on the dev tenant's outbound subject of
// one group, as converge does.
func publishOutbound(t *testing.T, env *natstest.Env, payloads ...string) {
	t.Helper()
	publishTenant(t, env.JS, "dev", payloads...)
}

func publishTenant(t *testing.T, js jetstream.JetStream, tenant string, payloads ...string) {
	t.Helper()
	for _, p := range payloads {
		tm := schema.TransportMessage{V: schema.TransportVersion, Group: []byte{0x0f, 0xf0}, Kind: schema.TransportMLS, Payload: []byte(p)}
		b, err := tm.MarshalMsgpack()
		if err != nil {
			t.Fatal(err)
		}
		id := sha256.Sum256([]byte(p))
		msg := &nats.Msg{Subject: "fabric.out." + tenant + ".0ff0", Data: b, Header: nats.Header{}}
		msg.Header.Set(bus.HeaderMessageID, hex.EncodeToString(id[:]))
		if _, err := js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
}

type running struct {
	b      *Bridge
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// provisioner answers bridges' requests for consumers through js, as
// ingest does, until the test ends.
func provisioner(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	p := NewProvisioner(js, slog.New(slog.NewTextHandler(io.Discard, nil)))
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-p.Started():
	case err := <-done:
		t.Fatalf("the provisioner stopped: %v", err)
	}
}

func startBridge(t *testing.T, env *natstest.Env, url string) *running {
	t.Helper()
	provisioner(t, env.JS)
	reg := prometheus.NewRegistry()
	b, err := New(Config{JS: env.JS, Tenant: "dev", Destination: url, Token: func(context.Context) (string, error) { return "tok", nil },
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, AckWait: 2 * time.Second, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{b: b, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	select {
	case <-b.Started():
	case <-time.After(20 * time.Second):
		t.Fatal("the bridge made no consumer")
	}
	return r
}

// settled reports whether the bridge's consumer has acknowledged (or
// terminated) every outbound message.
func settled(t *testing.T, env *natstest.Env) bool {
	info, err := env.JS.Consumer(context.Background(), streams.StreamEvents, DefaultDurable)
	if err != nil {
		t.Fatal(err)
	}
	ci, err := info.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ci.NumPending == 0 && ci.NumAckPending == 0 && ci.Delivered.Stream > 0
}

// Issue 19, fabric bridge: a post the destination does not take (503,
// 429) is retried with backoff, the messages held meanwhile; they are
// acknowledged only once answered, and arrive in the order stored.
func TestBridgeRetriesUntilTheDestinationAccepts(t *testing.T) {
	env := natstest.Start(t)
	dst := newDestination(t, func(post int, _ []string) (int, string) {
		switch post {
		case 1:
			return http.StatusServiceUnavailable, "unavailable"
		case 2:
			return http.StatusTooManyRequests, "rate_limited"
		}
		return http.StatusOK, ""
	})
	publishOutbound(t, env, "m1", "m2", "m3")
	r := startBridge(t, env, dst.URL)
	eventually.True(t, "the destination accepted three messages", func() bool { return len(dst.got()) == 3 })
	if got := dst.got(); !slices.Equal(got, []string{"m1", "m2", "m3"}) {
		t.Fatalf("the destination accepted %q", got)
	}
	eventually.True(t, "every message acknowledged", func() bool { return settled(t, env) })
	publishOutbound(t, env, "m4")
	eventually.True(t, "the next message forwarded", func() bool { return len(dst.got()) == 4 })
	if n := testutil.ToFloat64(r.b.metrics.retries.WithLabelValues("unavailable")); n != 1 {
		t.Errorf("retries after a 503: %v", n)
	}
	if n := testutil.ToFloat64(r.b.metrics.retries.WithLabelValues("rate_limited")); n != 1 {
		t.Errorf("retries after a 429: %v", n)
	}
	// The destination holds m4 before the bridge has read its answer.
	eventually.True(t, "fabric_bridge_messages_total queued 4", func() bool {
		return testutil.ToFloat64(r.b.metrics.messages.WithLabelValues("queued", "")) == 4
	})
}

// A source whose stream is not there yet (not provisioned, or its meta
// leader answering late) is waited for: the bridge retries its consumer
// and forwards once it can make it.
func TestBridgeWaitsForTheSourceStream(t *testing.T) {
	env := natstest.Start(t, natstest.WithoutStreams())
	provisioner(t, env.JS)
	dst := newDestination(t, func(int, []string) (int, string) { return http.StatusOK, "" })
	b, err := New(Config{JS: env.JS, Tenant: "dev", Destination: dst.URL, Token: func(context.Context) (string, error) { return "tok", nil },
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(100 * time.Millisecond) // a few attempts fail first; nothing to await
	if err := b.Ready(ctx); err == nil {
		t.Fatal("ready without a stream")
	}
	if err := streams.Ensure(ctx, env.JS, streams.Config{}); err != nil {
		t.Fatal(err)
	}
	publishOutbound(t, env, "m1")
	eventually.True(t, "the message forwarded once the stream exists", func() bool { return len(dst.got()) == 1 })
}

// A batch the destination refuses as a request (400) is posted again one
// message at a time: only the message refused is dropped, counted by its
// code; the others arrive in order and the bridge goes on.
func TestBridgeDropsOnlyTheMessageRefused(t *testing.T) {
	env := natstest.Start(t)
	dst := newDestination(t, func(_ int, payloads []string) (int, string) {
		if slices.Contains(payloads, "bad") {
			return http.StatusBadRequest, "bad_request"
		}
		return http.StatusOK, ""
	})
	publishOutbound(t, env, "m1", "bad", "m2")
	r := startBridge(t, env, dst.URL)
	eventually.True(t, "every message settled", func() bool { return settled(t, env) && len(dst.got()) == 2 })
	if got := dst.got(); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("the destination accepted %q", got)
	}
	if n := testutil.ToFloat64(r.b.metrics.refused.WithLabelValues("bad_request")); n != 1 {
		t.Errorf("fabric_bridge_refused_total bad_request: %v", n)
	}
}

// A destination that refuses the bridge itself (401: the token) stops it
// with an error naming the refusal; nothing is acknowledged, so a bridge
// started with the right token forwards every message.
func TestBridgeStopsWhenTheDestinationRefusesItsToken(t *testing.T) {
	env := natstest.Start(t)
	var allow sync.Mutex
	refuse := true
	dst := newDestination(t, func(int, []string) (int, string) {
		allow.Lock()
		defer allow.Unlock()
		if refuse {
			return http.StatusUnauthorized, "unauthenticated"
		}
		return http.StatusOK, ""
	})
	publishOutbound(t, env, "m1", "m2")
	r := startBridge(t, env, dst.URL)
	var err error
	select {
	case err = <-r.done:
		r.done <- err // for the cleanup
	case <-time.After(20 * time.Second):
		t.Fatal("the bridge went on after a 401")
	}
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Status != http.StatusUnauthorized || refused.Code != "unauthenticated" || !refused.Fatal() {
		t.Fatalf("Run returned %v, want the 401 refusal", err)
	}
	allow.Lock()
	refuse = false
	allow.Unlock()
	startBridge(t, env, dst.URL)
	eventually.True(t, "both messages forwarded after the fix", func() bool { return len(dst.got()) == 2 && settled(t, env) })
}

// docs/outbound.md gives a deployment's bridge user of tenant acme (its
// permissions read from the doc here): under it, the bridge of acme with
// consumer bridge-acme forwards acme's outbound messages and no other
// tenant's; the user can make no consumer on another tenant's outbound
// subjects or on the events, and cannot read ingest's consumer.
func TestBridgeRunsUnderItsTenantUserOfTheDocs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/outbound.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(doc), "{ user: acme-bridge")
	block, _, _ = strings.Cut(block, "```")
	var pub, sub []string
	for _, m := range regexp.MustCompile(`"([^"]+)"`).FindAllStringSubmatch(block, -1) {
		if strings.HasPrefix(m[1], "_INBOX") {
			sub = append(sub, m[1])
		} else {
			pub = append(pub, m[1])
		}
	}
	if len(pub) != 4 || len(sub) != 1 {
		t.Fatalf("docs/outbound.md's acme-bridge user: publish %q subscribe %q", pub, sub)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := natsserver.Start(ctx, natsserver.Options{StoreDir: t.TempDir(), InProcess: true, Users: []*server.User{
		{Username: "admin", Password: "admin-pw"},
		{Username: "acme-bridge", Password: "bridge-pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: pub}, Subscribe: &server.SubjectPermission{Allow: sub}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	admin, err := s.Connect(nats.UserInfo("admin", "admin-pw"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ajs, _ := jetstream.New(admin)
	if err := streams.Ensure(ctx, ajs, streams.Config{}); err != nil {
		t.Fatal(err)
	}
	provisioner(t, ajs)
	publishTenant(t, ajs, "other", "not acme's")
	publishTenant(t, ajs, "acme", "a1", "a2")
	nc, err := s.Connect(nats.UserInfo("acme-bridge", "bridge-pw"), nats.CustomInboxPrefix("_INBOX_acme-bridge"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)

	dst := newDestination(t, func(int, []string) (int, string) { return http.StatusOK, "" })
	dst.tenant = "acme"
	b, err := New(Config{JS: js, Tenant: "acme", Durable: "bridge-acme", Destination: dst.URL, Token: func(context.Context) (string, error) { return "tok", nil },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(rctx) }()
	eventually.True(t, "acme's messages forwarded", func() bool { return len(dst.got()) == 2 })
	rcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := dst.got(); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("forwarded %q", got)
	}
	for _, cfg := range []jetstream.ConsumerConfig{
		{Durable: "bridge-acme", FilterSubject: "fabric.out.other.*"},
		{Durable: "bridge-acme", FilterSubject: "fabric.ev.>"},
		{Durable: "spy", FilterSubject: "fabric.out.acme.*"},
		{Durable: "bridge-acme", FilterSubject: "fabric.out.acme.*"},
		{Durable: "to-live", FilterSubject: "fabric.out.acme.*", DeliverSubject: "fabric.live.acme.c0ffee"},
	} {
		cctx, ccancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := js.CreateOrUpdateConsumer(cctx, streams.StreamEvents, cfg)
		ccancel()
		if err == nil {
			t.Errorf("acme-bridge made consumer %s on %s", cfg.Durable, cfg.FilterSubject)
		}
	}
	for _, subj := range []string{"fabric.bridge.other.bridge-acme", "fabric.bridge.acme.spy"} {
		rctx, rcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := nc.RequestWithContext(rctx, subj, []byte(`{}`))
		rcancel()
		if err == nil {
			t.Errorf("acme-bridge asked for a consumer on %s", subj)
		}
	}
	if _, err := ajs.CreateOrUpdateConsumer(ctx, streams.StreamEvents, jetstream.ConsumerConfig{Durable: streams.ConsumerOutbound, FilterSubject: "fabric.out.>", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer ccancel()
	if _, err := js.Consumer(cctx, streams.StreamEvents, streams.ConsumerOutbound); err == nil {
		t.Error("acme-bridge reads ingest's consumer")
	}
}

// Whatever the destination answers, the bridge reads it as n results, a
// refusal or a retry: never a panic, never fewer or more results than
// messages, never a wait longer than an hour.
func FuzzReadAnswer(f *testing.F) {
	f.Add(200, "", []byte(`{"results":[{"message_id":"00","status":"queued"}]}`), 1)
	f.Add(200, "", []byte(`{"results":[]}`), 1)
	f.Add(429, "1", []byte(`{"error":{"code":"rate_limited","message":"slow down"}}`), 2)
	f.Add(429, "-5", []byte(``), 1)
	f.Add(400, "", []byte(`{"error":{"code":"bad_request","message":"messages[0].payload: want bin"}}`), 1)
	f.Add(503, "", []byte(`<html>`), 3)
	f.Fuzz(func(t *testing.T, status int, retryAfter string, reply []byte, n int) {
		results, err := readAnswer(status, retryAfter, reply, n)
		var refused *RefusedError
		var retry *retryError
		switch {
		case err == nil:
			if status != http.StatusOK || len(results) != n {
				t.Fatalf("status %d: %d results for %d messages", status, len(results), n)
			}
		case errors.As(err, &retry):
			if retry.after < 0 || retry.after > time.Hour {
				t.Fatalf("waits %v", retry.after)
			}
		case errors.As(err, &refused):
			if refused.Status < 400 || refused.Status >= 500 || refused.Status == http.StatusTooManyRequests || refused.Code == "" {
				t.Fatalf("refusal %+v", refused)
			}
		default:
			t.Fatalf("error %v of no kind", err)
		}
	})
}
