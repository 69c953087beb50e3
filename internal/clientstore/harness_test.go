package clientstore

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/pkg/schema"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// fakeClock is a Clock the test advances. Every NewTimer call is counted,
// so a test can wait until the epoch timer re-armed after a firing, which
// is when its work is done.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	armed  int
	cond   *sync.Cond
}

type fakeTimer struct {
	c  *fakeClock
	at time.Time
	ch chan time.Time
}

func newFakeClock(now time.Time) *fakeClock {
	c := &fakeClock{now: now}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		t.ch <- c.now
	} else {
		c.timers = append(c.timers, t)
	}
	c.armed++
	c.cond.Broadcast()
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, o := range t.c.timers {
		if o == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			return true
		}
	}
	return false
}

// Advance moves the clock and fires the timers that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			t.ch <- c.now
		} else {
			kept = append(kept, t)
		}
	}
	c.timers = kept
}

// Armed returns how many timers were started so far.
func (c *fakeClock) Armed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.armed
}

// WaitArmed waits until at least n timers were started.
func (c *fakeClock) WaitArmed(t testing.TB, n int) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		c.mu.Lock()
		for c.armed < n {
			c.cond.Wait()
		}
		c.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("timer not re-armed: %d of %d", c.Armed(), n)
	}
}

// env is a NATS server with the fabric's streams, a vault, a verifier and
// a clock: what a Store needs.
type env struct {
	t     testing.TB
	ns    *natsserver.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	vault *engine.Vault
	ver   *auth.Verifier
	clock *fakeClock
	stops map[*Store]func()
}

// running runs s until the test ends or stop is called; stop returns once
// Run has.
func running(t testing.TB, s *Store) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// epochStart is an HMAC epoch boundary under testPeriod, plus a margin.
var epochStart = time.Unix(1_800_000_000-1_800_000_000%3600, 0).Add(10 * time.Minute)

const testPeriod = time.Hour

func newEnv(t testing.TB) *env {
	t.Helper()
	n := natstest.Start(t, natstest.OverLoopback())
	e := &env{t: t, ns: n.Server, nc: n.Conn, js: n.JS, clock: newFakeClock(epochStart)}
	var err error
	if e.vault, err = engine.NewVault(bytes.Repeat([]byte{7}, 32)); err != nil {
		t.Fatal(err)
	}
	if e.ver, err = auth.NewVerifier(testSecret); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) connect() {
	nc, err := e.ns.Connect()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	e.nc = nc
	if e.js, err = jetstream.New(nc); err != nil {
		e.t.Fatal(err)
	}
}

// restartServer stops and starts the NATS server over the same store dir.
func (e *env) restartServer() {
	e.t.Helper()
	e.nc.Close()
	e.ns.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.ns.Restart(ctx); err != nil {
		e.t.Fatal(err)
	}
	e.connect()
}

// store opens a Store with an HTTP server; both close with the test.
func (e *env) store() (*Store, *httptest.Server) {
	e.t.Helper()
	s, err := New(context.Background(), Config{JS: e.js, Vault: e.vault, Verifier: e.ver, Clock: e.clock, HMACEpochPeriod: testPeriod})
	if err != nil {
		e.t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	e.t.Cleanup(srv.Close)
	if e.stops == nil {
		e.stops = map[*Store]func(){}
	}
	e.stops[s] = running(e.t, s)
	return s, srv
}

func token(t testing.TB, tenant string, clients []string, scopes ...auth.Scope) string {
	t.Helper()
	tok, err := auth.Mint(testSecret, auth.Claims{Tenant: tenant, Scopes: scopes, Clients: clients, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func adminToken(t testing.TB, tenant string) string {
	return token(t, tenant, []string{auth.AllClients}, auth.ScopeAdmin)
}

// do sends a JSON request and decodes a JSON answer into out (if not nil).
// It returns the status and the raw body.
func do(t testing.TB, method, url, tok string, body, out any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("decode %s: %v", raw, err)
		}
	}
	return resp.StatusCode, raw
}

// received is one event read back from FABRIC_EVENTS.
type received = natstest.StoredEvent

// events reads every event on a client's subject.
func (e *env) events(tenant, clientID string) []received {
	e.t.Helper()
	return natstest.ClientEvents(e.t, e.js, tenant, clientID)
}

// register registers a client over HTTP and returns its answer.
func register(t testing.TB, srv *httptest.Server, tenant string, req RegisterRequest) ClientInfo {
	t.Helper()
	var ci ClientInfo
	status, raw := do(t, http.MethodPost, srv.URL+"/v1/tenants/"+tenant+"/clients", adminToken(t, tenant), req, &ci)
	if status != http.StatusCreated {
		t.Fatalf("register: %d %s", status, raw)
	}
	return ci
}

func inboxOf(b byte) string {
	return schema.Bytes(bytes.Repeat([]byte{b}, 32)).String()
}
