package read_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fixture is an all-in-one fabric with one hosted client, the SDK
// connected to its events and a Reader of its state.
type fixture struct {
	f      *allinone.Fabric
	api    *demo.API
	hosted demo.Registered
	events *client.Client
	reader *client.Reader
	token  string // scope read
	data   string // the fabric's data directory
	// jwtSecret and masterKey are the fabric's, so a test starts another
	// API instance beside it.
	jwtSecret, masterKey []byte
}

func start(t testing.TB) *fixture { return startWith(t, allinone.Options{}) }

// startWith starts an all-in-one with o (its data directory, addresses
// and logger set here).
func startWith(t testing.TB, o allinone.Options) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o.DataDir, o.Listen, o.NATSListen, o.Logger = t.TempDir(), "127.0.0.1:0", "127.0.0.1:0", slog.New(slog.DiscardHandler)
	for _, k := range []*[]byte{&o.JWTSecret, &o.MasterKey} {
		if *k == nil {
			*k = make([]byte, 32)
			_, _ = rand.Read(*k)
		}
	}
	f, err := allinone.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	tok := func(s auth.Scope) string {
		v, err := f.Token(time.Hour, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	fx := &fixture{f: f, data: o.DataDir, token: tok(auth.ScopeRead), jwtSecret: o.JWTSecret, masterKey: o.MasterKey}
	fx.api = &demo.API{BaseURL: f.URL, Tenant: allinone.DevTenant, AdminToken: tok(auth.ScopeAdmin), IngestToken: tok(auth.ScopeIngest)}
	account := make([]byte, 32)
	_, _ = rand.Read(account)
	if fx.hosted, err = fx.api.Register(ctx, hex.EncodeToString(account)); err != nil {
		t.Fatal(err)
	}
	if fx.events, err = client.Connect(ctx, "ws"+strings.TrimPrefix(f.URL, "http")+"/v1/events", tok(auth.ScopeEvents)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fx.events.Close() })
	fx.reader = client.NewReader(f.URL, allinone.DevTenant, fx.token)
	return fx
}

// heldClock is a converge clock (allinone.Options.ConvergeNow) a test
// holds: the time held (unix ms), the real time while it holds 0.
func heldClock(held *atomic.Int64) func() time.Time {
	return func() time.Time {
		if ms := held.Load(); ms != 0 {
			return time.UnixMilli(ms)
		}
		return time.Now()
	}
}

// post plays transport messages and checks each is queued.
func (fx *fixture) post(t testing.TB, msgs ...testpeer.Message) {
	t.Helper()
	for _, m := range msgs {
		res, err := fx.api.Post(context.Background(), m.Transport)
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Status != "queued" {
			t.Fatalf("intake answered %+v", res[0])
		}
	}
}

// getJSON reads a route of the hosted client as JSON; it returns the
// status and the decoded body.
func (fx *fixture) getJSON(t *testing.T, path string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, fx.f.URL+"/v1/tenants/"+allinone.DevTenant+"/clients/"+fx.hosted.ClientID+path, nil)
	req.Header.Set("Authorization", "Bearer "+fx.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: content type %q", path, resp.Header.Get("Content-Type"))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	return resp.StatusCode
}

// natsAs connects to the fabric's NATS server as one of its users; the
// test's end closes the connection.
func (fx *fixture) natsAs(t testing.TB, user string) jetstream.JetStream {
	t.Helper()
	pw, err := os.ReadFile(allinone.NATSPasswordFile(fx.data, user))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(fx.f.NATSURL, nats.UserInfo(user, strings.TrimSpace(string(pw))), nats.CustomInboxPrefix(allinone.InboxPrefix(user)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// getMsgpack reads a route of the hosted client as msgpack.
func (fx *fixture) getMsgpack(t testing.TB, path string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, fx.f.URL+"/v1/tenants/"+allinone.DevTenant+"/clients/"+fx.hosted.ClientID+path, nil)
	req.Header.Set("Authorization", "Bearer "+fx.token)
	req.Header.Set("Accept", "application/msgpack")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if err := schema.UnmarshalMsgpack(b, out); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
	}
	return resp.StatusCode
}

// apiError is the API's error shape.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// collect subscribes to every kind and hands the events on a channel,
// until the test ends.
func (fx *fixture) collect(t testing.TB) <-chan schema.ClientEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan schema.ClientEvent, 1024)
	sub, err := fx.events.Subscribe(ctx, fx.hosted.ClientID, schema.EventFilter{Kinds: schema.AllKinds()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		defer close(ch)
		for {
			ev, err := sub.Next(ctx)
			if err != nil {
				return
			}
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// await reads events until one of kind arrives.
func await(t testing.TB, ch <-chan schema.ClientEvent, kind schema.EventKind) schema.ClientEvent {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("subscription ended waiting for %s", kind)
			}
			if ev.Kind == kind {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s", kind)
		}
	}
}
