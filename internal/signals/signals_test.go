package signals

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testSecret = []byte("0123456789abcdef0123456789abcdef")

const tenant = "acme"

// env is a NATS server with the fabric's streams, a client store to
// register clients, and the signals service, each behind an HTTP server.
type env struct {
	t      testing.TB
	ns     *natsserver.Server
	js     jetstream.JetStream
	stores *httptest.Server
	sig    *Service
	srv    *httptest.Server
	reg    *prometheus.Registry
	// delivered is the newest delivery number hold gave per client and
	// group.
	delivered map[string]uint64
}

func newEnv(t testing.TB) *env {
	t.Helper()
	n := natstest.Start(t, natstest.OverLoopback())
	e := &env{t: t, ns: n.Server, js: n.JS, reg: prometheus.NewRegistry()}
	e.start()
	return e
}

func (e *env) open() {
	nc, err := e.ns.Connect()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	if e.js, err = jetstream.New(nc); err != nil {
		e.t.Fatal(err)
	}
}

// start opens a client store and a signals service over e.js.
func (e *env) start() {
	ctx := context.Background()
	ver, err := auth.NewVerifier(testSecret)
	if err != nil {
		e.t.Fatal(err)
	}
	vault, err := engine.NewVault(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		e.t.Fatal(err)
	}
	cs, err := clientstore.New(ctx, clientstore.Config{JS: e.js, Vault: vault, Verifier: ver})
	if err != nil {
		e.t.Fatal(err)
	}
	e.stores = httptest.NewServer(cs.Handler())
	if e.sig, err = New(ctx, Config{JS: e.js, Verifier: ver, Registerer: e.reg}); err != nil {
		e.t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.sig.Handler())
	stores, srv := e.stores, e.srv
	e.t.Cleanup(func() { srv.Close(); stores.Close() })
}

// restart stops the services and the NATS server, and starts them again
// over the same store directory.
func (e *env) restart() {
	e.srv.Close()
	e.stores.Close()
	e.ns.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.ns.Restart(ctx); err != nil {
		e.t.Fatal(err)
	}
	e.open()
	e.start()
}

func token(t testing.TB, tenant string, clients []string, scopes ...auth.Scope) string {
	t.Helper()
	tok, err := auth.Mint(testSecret, auth.Claims{Tenant: tenant, Scopes: scopes, Clients: clients, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// register registers a hosted client through the client store.
func (e *env) register(tenant string, inbox byte, handle string) clientstore.ClientInfo {
	e.t.Helper()
	body, _ := json.Marshal(clientstore.RegisterRequest{InboxID: schema.Bytes(bytes.Repeat([]byte{inbox}, 32)).String(), CredentialHandle: handle})
	req, _ := http.NewRequest(http.MethodPost, e.stores.URL+"/v1/tenants/"+tenant+"/clients", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token(e.t, tenant, []string{"*"}, auth.ScopeAdmin))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var ci clientstore.ClientInfo
	if resp.StatusCode != http.StatusCreated {
		e.t.Fatalf("register: %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&ci); err != nil {
		e.t.Fatal(err)
	}
	return ci
}

// result is one signal request's outcome.
type result struct {
	status   int
	replayed bool
	answer   Answer
	errCode  string
	errMsg   string
}

// post reports body (JSON) under key for a client, with a signals token
// for the tenant naming every client unless tok is given.
func (e *env) post(tenant, clientID, key string, body []byte, tok ...string) result {
	e.t.Helper()
	return e.postAt("signals", tenant, clientID, key, body, tok...)
}

// postAt is post to another endpoint below the client.
func (e *env) postAt(endpoint, tenant, clientID, key string, body []byte, tok ...string) result {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/tenants/"+tenant+"/clients/"+clientID+"/"+endpoint, bytes.NewReader(body))
	if len(tok) > 0 {
		req.Header.Set("Authorization", "Bearer "+tok[0])
	} else {
		req.Header.Set("Authorization", "Bearer "+token(e.t, tenant, []string{"*"}, auth.ScopeSignals))
	}
	if key != "" {
		req.Header.Set(IdempotencyHeader, key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := result{status: resp.StatusCode, replayed: resp.Header.Get(ReplayedHeader) == "true"}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &r.answer); err != nil {
			e.t.Fatal(err)
		}
		return r
	}
	var er struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(raw, &er); err != nil {
		e.t.Fatalf("error body %s: %v", raw, err)
	}
	r.errCode, r.errMsg = er.Error.Code, er.Error.Message
	return r
}

func (e *env) postEvent(tenant, clientID, key string, ev schema.ClientEvent) result {
	e.t.Helper()
	b, err := ev.MarshalJSON()
	if err != nil {
		e.t.Fatal(err)
	}
	return e.post(tenant, clientID, key, b)
}

// received is one event read back from FABRIC_EVENTS.
type received = natstest.StoredEvent

// events reads every event on a client's subject.
func (e *env) events(tenant, clientID string) []received {
	e.t.Helper()
	return natstest.ClientEvents(e.t, e.js, tenant, clientID)
}

// signals returns a client's events after identity.registered.
func (e *env) signals(tenant, clientID string) []received {
	evs := e.events(tenant, clientID)
	if len(evs) == 0 || evs[0].Event.Kind != schema.KindIdentityRegistered {
		e.t.Fatal("first event is not identity.registered")
	}
	return evs[1:]
}

// holdSample puts the message the samples' message signals name in the
// read model: the client's own message msgID of group.
func (e *env) holdSample(c clientstore.ClientInfo) {
	e.t.Helper()
	e.hold(c, group, msgID, true, readmodel.StateDelivered)
}

func wantID(tenant, clientID, key, target string) string {
	return outbox.ID(tenant, clientID, "signal", digestHex(key), target)
}

func str(s string) *string { return &s }

var (
	group = schema.Bytes{0xa1, 0xb2, 0xc3}
	msgID = schema.Bytes(bytes.Repeat([]byte{0x44}, 32))
	att   = schema.AttachmentRef{AttachmentKey: "att-1", URL: "https://files.example/1", ContentDigest: "00ff"}
	attF  = schema.AttachmentFailed{AttachmentKey: "att-1", URL: "https://files.example/1", ContentDigest: "00ff", Cause: "network"}
)

// signalSamples is one event of every signal kind, each payload member set,
// in an order each applies to the state the ones before it left: the
// message ones to the client's own message msgID of group (holdSample),
// a download's end after its start.
func signalSamples() []schema.ClientEvent {
	a := att
	return []schema.ClientEvent{
		{Kind: schema.KindMessageStatusChanged, MessageStatusChanged: &schema.MessageStatusChanged{GroupID: group, MessageID: msgID, Previous: schema.StatusPublished, Current: schema.StatusFailed}},
		{Kind: schema.KindMessageDeleted, MessageDeleted: &schema.MessageDeleted{GroupID: group, MessageID: msgID, Cause: schema.DeletionDeletedLocally}},
		{Kind: schema.KindRejectedByServer, RejectedByServer: &schema.ClientRejectedByServer{Cause: schema.RejectionVersionTooOld, MinLibxmtpVersion: str("1.4.0")}},
		{Kind: schema.KindRejectedByServer, RejectedByServer: &schema.ClientRejectedByServer{Cause: schema.RejectionBackendMismatch}},
		{Kind: schema.KindLockoutChanged, LockoutChanged: &schema.LockoutChanged{Change: schema.LockoutEntered}},
		{Kind: schema.KindNotificationsFailed, NotificationsFailed: &schema.NotificationsFailed{Cause: "token_expired"}},
		{Kind: schema.KindArchiveRestored, ArchiveRestored: &schema.ArchiveRestored{Complete: false}},
		{Kind: schema.KindAttachmentUploadStarted, AttachmentUploadStarted: &a},
		{Kind: schema.KindAttachmentUploadCompleted, AttachmentUploadCompleted: &a},
		{Kind: schema.KindAttachmentUploadFailed, AttachmentUploadFailed: &attF},
		{Kind: schema.KindAttachmentDownloadStarted, AttachmentDownloadStarted: &a},
		{Kind: schema.KindAttachmentDownloadCompleted, AttachmentDownloadCompleted: &a},
		{Kind: schema.KindAttachmentDownloadStarted, AttachmentDownloadStarted: &a},
		{Kind: schema.KindAttachmentDownloadFailed, AttachmentDownloadFailed: &attF},
		{Kind: schema.KindAttachmentDeleted, AttachmentDeleted: &a},
	}
}

// A signal naming a group of a stitched DM carries the DM's conversation
// key, as converge's events of the group do, so a filter naming another
// group of the DM selects it (EVENT-020); a signal of another group does not.
func TestGroupSignalCarriesConversationKey_EVENT020(t *testing.T) {
	e := newEnv(t)
	ci := e.register("acme", 1, "")
	e.holdSample(ci)
	groups, err := e.js.KeyValue(context.Background(), streams.BucketGroups)
	if err != nil {
		t.Fatal(err)
	}
	dmKey := bytes.Repeat([]byte{0xd0}, 32)
	rec, err := msgpack.Marshal(map[string]any{"members": []string{ci.ClientID}, "dm_conversation_key": dmKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := groups.Put(context.Background(), "acme."+group.String(), rec); err != nil {
		t.Fatal(err)
	}
	other := schema.Bytes{0x0e}
	otherMsg := e.hold(ci, other, msgIDOf(0x45), true, readmodel.StateDelivered)
	for i, m := range []held{{group, msgID}, otherMsg} {
		ev := statusSignal(m.group, m.id, schema.StatusPublished, schema.StatusFailed)
		if r := e.postEvent("acme", ci.ClientID, fmt.Sprint("k", i), ev); r.status != http.StatusOK {
			t.Fatalf("signal: %+v", r)
		}
	}
	evs := e.signals("acme", ci.ClientID)
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2", len(evs))
	}
	if got, want := evs[0].ConversationKey, hex.EncodeToString(dmKey); got != want {
		t.Errorf("DM group's signal has conversation key %q, want %q", got, want)
	}
	if got := evs[1].ConversationKey; got != "" {
		t.Errorf("other group's signal has conversation key %q", got)
	}
}

// Every signal kind reaches the client's subject as sent, each payload
// member intact, with an id derived from tenant, client and key.
func TestEverySignalKindIsRouted(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 1, "")
	e.holdSample(c)
	samples := signalSamples()
	for i, ev := range samples {
		key := "k-" + string(rune('a'+i))
		if r := e.postEvent(tenant, c.ClientID, key, ev); r.status != http.StatusOK || r.answer.Emitted != 1 || r.replayed {
			t.Fatalf("%s: %+v", ev.Kind, r)
		}
	}
	got := e.signals(tenant, c.ClientID)
	if len(got) != len(samples) {
		t.Fatalf("%d events, want %d", len(got), len(samples))
	}
	for i, ev := range samples {
		want, _ := ev.MarshalMsgpack()
		have, _ := got[i].Event.MarshalMsgpack()
		if !bytes.Equal(want, have) {
			t.Errorf("%s: payload differs:\n got %+v\nwant %+v", ev.Kind, got[i].Event, ev)
		}
		if got[i].ID != wantID(tenant, c.ClientID, "k-"+string(rune('a'+i)), c.ClientID) {
			t.Errorf("%s: event id", ev.Kind)
		}
	}
	// EVENT-008: min_libxmtp_version exactly for version_too_old.
	if p := got[2].Event.RejectedByServer; p.MinLibxmtpVersion == nil || *p.MinLibxmtpVersion != "1.4.0" {
		t.Error("version_too_old lost min_libxmtp_version")
	}
	if got[3].Event.RejectedByServer.MinLibxmtpVersion != nil {
		t.Error("backend_mismatch carries min_libxmtp_version")
	}
}

func TestRepeatedIdempotencyKeyEmitsNothing(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 2, "")
	e.holdSample(c)
	ev := signalSamples()[0]
	first := e.postEvent(tenant, c.ClientID, "same", ev)
	again := e.postEvent(tenant, c.ClientID, "same", ev)
	if first.status != 200 || again.status != 200 || again.answer != first.answer || first.replayed || !again.replayed {
		t.Fatalf("first %+v, again %+v", first, again)
	}
	other := signalSamples()[1]
	if r := e.postEvent(tenant, c.ClientID, "same", other); r.status != http.StatusUnprocessableEntity || r.errCode != "idempotency_key_reused" {
		t.Fatalf("key reused for another signal: %+v", r)
	}
	// Concurrent twins of one request: one event.
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			if r := e.postEvent(tenant, c.ClientID, "twin", other); r.status != 200 || r.answer.Emitted != 1 {
				t.Errorf("twin: %+v", r)
			}
		})
	}
	wg.Wait()
	got := e.signals(tenant, c.ClientID)
	if len(got) != 2 || got[0].ID != wantID(tenant, c.ClientID, "same", c.ClientID) || got[1].ID != wantID(tenant, c.ClientID, "twin", c.ClientID) {
		t.Fatalf("%d events", len(got))
	}
}

func TestRefusesWhatIsNotASignal(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 3, "")
	cases := []struct {
		name   string
		body   string
		key    string
		status int
		code   string
		says   string
	}{
		{"convergence kind", `{"kind":"message.received","message_received":{"group_id":"a1","message_id":"b2","sender_inbox_id":"x"}}`, "1", 422, "kind_not_signal", "convergence"},
		{"fork detected", `{"kind":"conversation.fork_detected","conversation_fork_detected":{"group_id":"a1"}}`, "2", 422, "kind_not_signal", "convergence"},
		{"store kind", `{"kind":"consent.changed","consent_changed":{"entity_kind":"inbox","entity":"ab","state":"allowed"}}`, "3", 422, "kind_not_signal", "client stores"},
		{"handle kind", `{"kind":"handle.changed","handle_changed":{"inbox_id":"ab","handle":"h"}}`, "4", 422, "kind_not_signal", "client stores"},
		{"deleted by commit", `{"kind":"message.deleted","message_deleted":{"group_id":"a1","message_id":"b2","cause":"deleted"}}`, "5", 422, "kind_not_signal", "deleted_locally"},
		{"lagged", `{"kind":"lagged","lagged":{"discarded":3}}`, "6", 422, "kind_not_signal", "gateway"},
		{"version without minimum", `{"kind":"client.rejected_by_server","rejected_by_server":{"cause":"version_too_old"}}`, "7", 422, "invalid_event", "min_libxmtp_version"},
		{"minimum without version", `{"kind":"client.rejected_by_server","rejected_by_server":{"cause":"backend_mismatch","min_libxmtp_version":"1.0"}}`, "8", 422, "invalid_event", "min_libxmtp_version"},
		{"no state change", `{"kind":"connection.state_changed","connection_state_changed":{"previous":"connected","current":"connected"}}`, "9", 422, "invalid_event", "current"},
		{"connection state", `{"kind":"connection.state_changed","connection_state_changed":{"previous":"closed","current":"connected"}}`, "16", 422, "kind_not_signal", "each stream"},
		{"wrong member", `{"kind":"archive.restored","notifications_failed":{"cause":"x"}}`, "10", 422, "invalid_event", ""},
		{"unknown member", `{"kind":"archive.restored","archive_restored":{"complete":true,"extra":1}}`, "11", 400, "bad_request", "extra"},
		{"uppercase hex", `{"kind":"message.deleted","message_deleted":{"group_id":"A1","message_id":"b2","cause":"deleted_locally"}}`, "12", 400, "bad_request", "group_id"},
		{"not json", `{"kind":`, "13", 400, "bad_request", ""},
		{"unknown kind", `{"kind":"message.exploded","archive_restored":{"complete":true}}`, "14", 400, "bad_request", ""},
		{"no idempotency key", `{"kind":"archive.restored","archive_restored":{"complete":true}}`, "", 400, "bad_request", IdempotencyHeader},
		{"empty body", ``, "15", 400, "bad_request", "empty"},
	}
	for _, tc := range cases {
		r := e.post(tenant, c.ClientID, tc.key, []byte(tc.body))
		if r.status != tc.status || r.errCode != tc.code || !strings.Contains(r.errMsg, tc.says) {
			t.Errorf("%s: %d %s %q", tc.name, r.status, r.errCode, r.errMsg)
		}
	}
	if n := len(e.signals(tenant, c.ClientID)); n != 0 {
		t.Fatalf("refused signals emitted %d events", n)
	}
}

// stream reports one stream's state under key.
func (e *env) stream(clientID, key, id string, st schema.ConnectionState) result {
	e.t.Helper()
	b, err := json.Marshal(StreamReport{StreamID: id, State: st})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.postAt("connection", tenant, clientID, key, b)
}

// The client's connection state is computed over its open streams; each
// change is one connection.state_changed whose previous is the state the
// client held, whatever a stream was before; a report that leaves the
// computed state as it was emits nothing, a first closed included.
func TestConnectionStatePreviousIsHeld_EVENT027(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 4, "")
	const (
		closed       = schema.ConnectionClosed
		connecting   = schema.ConnectionConnecting
		connected    = schema.ConnectionConnected
		reconnecting = schema.ConnectionReconnecting
		failed       = schema.ConnectionFailed
	)
	steps := []struct {
		stream string
		state  schema.ConnectionState
		held   schema.ConnectionState // the client's state after the report
	}{
		{"a", closed, closed},         // nothing was open: no change
		{"a", connecting, connecting}, // closed -> connecting
		{"b", connected, connecting},  // a still connecting
		{"a", connected, connected},   // connecting -> connected
		{"b", reconnecting, reconnecting},
		{"a", failed, failed},       // failed wins over reconnecting
		{"b", connected, failed},    // a is still failed
		{"a", closed, connected},    // failed -> connected: b alone is open
		{"b", connected, connected}, // the same again
		{"b", closed, closed},       // none open
	}
	var want []schema.ConnectionStateChanged
	held := closed
	for i, st := range steps {
		r := e.stream(c.ClientID, fmt.Sprint("s", i), st.stream, st.state)
		emit := 0
		if st.held != held {
			emit = 1
			want = append(want, schema.ConnectionStateChanged{Previous: held, Current: st.held})
		}
		if r.status != http.StatusOK || r.answer.Emitted != emit || r.answer.Connection != st.held {
			t.Fatalf("step %d (%s %s): %+v, want emitted %d, connection %s", i, st.stream, st.state, r, emit, st.held)
		}
		held = st.held
	}
	got := e.signals(tenant, c.ClientID)
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d", len(got), len(want))
	}
	for i, w := range want {
		if p := got[i].Event.ConnectionStateChanged; p == nil || *p != w {
			t.Errorf("event %d: %+v, want %+v", i, p, w)
		}
	}
	// A repeated key answers as before and emits nothing.
	if r := e.stream(c.ClientID, "s1", "a", connecting); !r.replayed || r.answer.Emitted != 1 || r.answer.Connection != connecting {
		t.Errorf("repeated key: %+v", r)
	}
	if n := len(e.signals(tenant, c.ClientID)); n != len(want) {
		t.Errorf("repeated key emitted: %d events", n)
	}
}

// Stream reports are checked: a stream id and one of the states, at most
// MaxStreams open at once.
func TestStreamReportsAreChecked(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 16, "")
	for name, body := range map[string]string{
		"no stream id":  `{"state":"connected"}`,
		"unknown state": `{"stream_id":"a","state":"online"}`,
		"space in id":   `{"stream_id":"a b","state":"connected"}`,
		"unknown field": `{"stream_id":"a","state":"connected","previous":"closed"}`,
	} {
		if r := e.postAt("connection", tenant, c.ClientID, name, []byte(body)); r.status != http.StatusBadRequest {
			t.Errorf("%s: %+v", name, r)
		}
	}
	for i := range MaxStreams {
		if r := e.stream(c.ClientID, fmt.Sprint("k", i), fmt.Sprint("s", i), schema.ConnectionConnected); r.status != http.StatusOK {
			t.Fatalf("stream %d: %+v", i, r)
		}
	}
	if r := e.stream(c.ClientID, "over", "one-more", schema.ConnectionConnected); r.status != http.StatusUnprocessableEntity || r.errCode != "too_many_streams" {
		t.Fatalf("stream past the bound: %+v", r)
	}
}

func lockout(ch schema.LockoutChange) schema.ClientEvent {
	return schema.ClientEvent{Kind: schema.KindLockoutChanged, LockoutChanged: &schema.LockoutChanged{Change: ch}}
}

func TestLockoutReachesEveryClientSharingTheCredential_EVENT055(t *testing.T) {
	e := newEnv(t)
	a := e.register(tenant, 5, "shared-key")
	b := e.register(tenant, 6, "shared-key")
	c := e.register(tenant, 7, "own-key")
	d := e.register("globex", 8, "shared-key") // same handle, another tenant

	if r := e.postEvent(tenant, a.ClientID, "l1", lockout(schema.LockoutEntered)); r.status != 200 || r.answer.Emitted != 2 {
		t.Fatalf("enter: %+v", r)
	}
	if r := e.postEvent(tenant, b.ClientID, "l2", lockout(schema.LockoutEntered)); r.status != 200 || r.answer.Emitted != 0 {
		t.Fatalf("enter again from a sharing client: %+v", r)
	}
	if r := e.postEvent(tenant, b.ClientID, "l3", lockout(schema.LockoutLeft)); r.status != 200 || r.answer.Emitted != 2 {
		t.Fatalf("leave: %+v", r)
	}
	for _, id := range []string{a.ClientID, b.ClientID} {
		got := e.signals(tenant, id)
		if len(got) != 2 {
			t.Fatalf("%d lockout events, want 2", len(got))
		}
		if got[0].Event.LockoutChanged.Change != schema.LockoutEntered || got[1].Event.LockoutChanged.Change != schema.LockoutLeft {
			t.Fatal("lockout events out of order")
		}
		if got[0].ID != wantID(tenant, a.ClientID, "l1", id) || got[1].ID != wantID(tenant, b.ClientID, "l3", id) {
			t.Fatal("lockout event ids")
		}
	}
	if n := len(e.signals(tenant, c.ClientID)); n != 0 {
		t.Fatalf("client with another credential got %d events", n)
	}
	if n := len(e.signals("globex", d.ClientID)); n != 0 {
		t.Fatalf("another tenant's client got %d events", n)
	}
}

// Concurrent signals of one attachment key are emitted in the order their
// ordering record accepted them (EVENT-057).
func TestAttachmentOrderPerKey_EVENT057(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 9, "")
	// Deletions of the key, each with another url: each applies whatever
	// came before it, so every one of them is emitted.
	var kinds []schema.ClientEvent
	for i := range 4 {
		a := att
		a.URL = fmt.Sprint(a.URL, "/", i)
		kinds = append(kinds, schema.ClientEvent{Kind: schema.KindAttachmentDeleted, AttachmentDeleted: &a})
	}
	var wg sync.WaitGroup
	const n = 12
	for i := range n {
		wg.Go(func() {
			if r := e.postEvent(tenant, c.ClientID, "a"+string(rune('a'+i)), kinds[i%len(kinds)]); r.status != 200 {
				t.Errorf("post %d: %+v", i, r)
			}
		})
	}
	wg.Wait()
	cl, err := clientstore.Lookup(context.Background(), e.sig.clients, tenant, c.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	okey, err := orderKey(cl, kinds[0])
	if err != nil {
		t.Fatal(err)
	}
	st, _, err := outbox.Get[orderState](context.Background(), e.sig.out, okey)
	if err != nil {
		t.Fatal(err)
	}
	got := e.signals(tenant, c.ClientID)
	if len(got) != n || len(st.Recent) != n {
		t.Fatalf("%d events, %d accepted, want %d", len(got), len(st.Recent), n)
	}
	for i, r := range st.Recent {
		if got[i].ID != outbox.ID(tenant, c.ClientID, "signal", r.Key, c.ClientID) {
			t.Fatalf("event %d is not the %d-th accepted signal", i, i)
		}
	}
}

func TestRefusesOtherTenantsClientsAndScopes(t *testing.T) {
	e := newEnv(t)
	a := e.register(tenant, 10, "")
	other := e.register("globex", 11, "")
	body, _ := signalSamples()[6].MarshalJSON()
	cases := []struct {
		name   string
		tenant string
		client string
		tok    string
		status int
	}{
		{"other tenant's token", tenant, a.ClientID, token(t, "globex", []string{"*"}, auth.ScopeSignals), 403},
		{"other tenant's client", tenant, other.ClientID, token(t, tenant, []string{"*"}, auth.ScopeSignals), 404},
		{"admin scope only", tenant, a.ClientID, token(t, tenant, []string{"*"}, auth.ScopeAdmin), 403},
		{"token for another client", tenant, a.ClientID, token(t, tenant, []string{other.ClientID}, auth.ScopeSignals), 403},
		{"no token", tenant, a.ClientID, "", 401},
	}
	for _, tc := range cases {
		if r := e.post(tc.tenant, tc.client, "k", body, tc.tok); r.status != tc.status {
			t.Errorf("%s: %+v", tc.name, r)
		}
	}
	if len(e.signals(tenant, a.ClientID)) != 0 || len(e.signals("globex", other.ClientID)) != 0 {
		t.Fatal("a refused signal emitted")
	}
}

// After a restart of NATS and the services, a repeated key still answers
// the first answer and emits nothing; the connection state survives.
func TestRestartEmitsNothingTwice(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 12, "")
	first := e.stream(c.ClientID, "r1", "a", schema.ConnectionConnected)
	e.restart()
	again := e.stream(c.ClientID, "r1", "a", schema.ConnectionConnected)
	if !again.replayed || again.answer != first.answer {
		t.Fatalf("after restart: %+v, first %+v", again, first)
	}
	if r := e.stream(c.ClientID, "r2", "b", schema.ConnectionConnected); r.answer.Emitted != 0 || r.answer.Connection != schema.ConnectionConnected {
		t.Fatalf("connection state lost across restart: %+v", r)
	}
	if n := len(e.signals(tenant, c.ClientID)); n != 1 {
		t.Fatalf("%d events, want 1", n)
	}
}

// A signal whose event could not be published is stored; the retry with
// the same key publishes it, once, with the same id.
func TestEmitFailureThenRetry(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 13, "")
	cl, err := clientstore.Lookup(context.Background(), e.sig.clients, tenant, c.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	ev := signalSamples()[5]
	real := e.sig.out
	e.sig.out = outbox.New(e.js, e.sig.stores, func(context.Context, outbox.Event) error { return errFailed })
	if _, _, err := e.sig.Report(context.Background(), cl, "f1", ev); err == nil {
		t.Fatal("report succeeded without a publisher")
	}
	if n := len(e.signals(tenant, c.ClientID)); n != 0 {
		t.Fatal("emitted without a publisher")
	}
	e.sig.out = real
	// The key is taken even though the first request never answered.
	if _, _, err := e.sig.Report(context.Background(), cl, "f1", signalSamples()[6]); err == nil || !strings.Contains(err.Error(), "idempotency_key_reused") {
		t.Fatalf("key reused for another signal after a failure: %v", err)
	}
	for range 2 {
		ans, _, err := e.sig.Report(context.Background(), cl, "f1", ev)
		if err != nil || ans.Emitted != 1 {
			t.Fatalf("retry: %+v %v", ans, err)
		}
	}
	got := e.signals(tenant, c.ClientID)
	if len(got) != 1 || got[0].ID != wantID(tenant, c.ClientID, "f1", c.ClientID) {
		t.Fatalf("%d events after retry", len(got))
	}
}

var errFailed = io.ErrClosedPipe

// A msgpack body is the same signal as its JSON form: same key, same
// digest, so the JSON repeat is a replay.
func TestMsgpackBody(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 14, "")
	e.holdSample(c)
	ev := signalSamples()[0]
	body, err := ev.MarshalMsgpack()
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/tenants/"+tenant+"/clients/"+c.ClientID+"/signals", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token(t, tenant, []string{c.ClientID}, auth.ScopeSignals))
	req.Header.Set("Content-Type", "application/msgpack")
	req.Header.Set(IdempotencyHeader, "mp")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/msgpack" {
		t.Fatalf("msgpack signal: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if r := e.postEvent(tenant, c.ClientID, "mp", ev); r.status != 200 || !r.replayed {
		t.Fatalf("JSON repeat: %+v", r)
	}
	if n := len(e.signals(tenant, c.ClientID)); n != 1 {
		t.Fatalf("%d events", n)
	}
}

func TestMetricsCountResultsAndRefusals(t *testing.T) {
	e := newEnv(t)
	c := e.register(tenant, 15, "")
	e.stream(c.ClientID, "m1", "a", schema.ConnectionConnected)
	e.stream(c.ClientID, "m1", "a", schema.ConnectionConnected)
	e.stream(c.ClientID, "m2", "b", schema.ConnectionConnected)
	e.post(tenant, c.ClientID, "m3", []byte(`{"kind":"lagged","lagged":{"discarded":1}}`))
	kind := string(schema.KindConnectionStateChanged)
	for result, want := range map[string]float64{resultEmitted: 1, resultReplayed: 1, resultUnchanged: 1} {
		if got := testutil.ToFloat64(e.sig.metrics.accepted.WithLabelValues(kind, result)); got != want {
			t.Errorf("%s: %v", result, got)
		}
	}
	if got := testutil.ToFloat64(e.sig.metrics.refusals.WithLabelValues("kind_not_signal")); got != 1 {
		t.Errorf("refusals: %v", got)
	}
	// Every kind and result, and the common refusal codes, exist at zero
	// from the start; kind_not_signal is the one series the requests added.
	want := len(acceptedKinds())*3 + 4 + 1
	if n, err := testutil.GatherAndCount(e.reg, "fabric_signals_accepted_total", "fabric_signals_refusals_total"); err != nil || n != want {
		t.Errorf("registry holds %d series, want %d: %v", n, want, err)
	}
}
