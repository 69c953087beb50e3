package ingest

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/internal/quota"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func TestMain(m *testing.M) {
	if plan := os.Getenv(benchCallerEnv); plan != "" {
		// BenchmarkIngest's caller process (bench_caller_test.go).
		if err := runBenchCaller(plan); err != nil {
			fmt.Fprintln(os.Stderr, "caller:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

const testTenant = "acme"

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// testVault seals the group keys the tests write as converge does.
var testVault = func() *engine.Vault {
	v, err := engine.NewVault([]byte("fedcba9876543210fedcba9876543210"))
	if err != nil {
		panic(err)
	}
	return v
}()

// env is an embedded JetStream server with the fabric's streams, and one or
// more ingest workers on it.
type env struct {
	t       testing.TB
	connect func() (*nats.Conn, error) // for the next worker
	url     string                     // the server's client URL
	nc      *nats.Conn
	js      jetstream.JetStream
	workers []*worker
}

type worker struct {
	svc  *Service
	nc   *nats.Conn
	http *httptest.Server
}

type envOpts struct {
	window  time.Duration
	limits  Limits
	workers int
	token   bool // NATS intake requires a token
	none    bool // no worker: the server and its streams only
	reg     prometheus.Registerer
	inBytes int64 // FABRIC_IN's byte bound; the default when 0
	// tenantIn bounds each tenant's bytes on FABRIC_IN (Config.InputBytes).
	tenantIn *quota.Tally
}

func newEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	ns := natstest.Start(t, natstest.OverLoopback(),
		natstest.WithStreams(streams.Config{DuplicateWindow: o.window, InputMaxBytes: o.inBytes}))
	e := &env{t: t, connect: func() (*nats.Conn, error) { return ns.Server.Connect() }, url: ns.Server.ClientURL(), nc: ns.Conn, js: ns.JS}
	if !o.none {
		e.addWorkers(o)
	}
	return e
}

func (e *env) addWorkers(o envOpts) {
	if o.workers == 0 {
		o.workers = 1
	}
	for range o.workers {
		e.addWorker(o)
	}
}

func (e *env) addWorker(o envOpts) *worker {
	t := e.t
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc, err := e.connect()
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewVerifier(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{Conn: nc, Verifier: v, Vault: testVault, Limits: o.limits, InputBytes: o.tenantIn, NATSIntake: true, NATSRequireToken: o.token, Registerer: o.reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w := &worker{svc: svc, nc: nc, http: httptest.NewServer(svc.Handler())}
	t.Cleanup(func() {
		w.http.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := svc.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		nc.Close()
	})
	e.workers = append(e.workers, w)
	return w
}

func token(t testing.TB, tenant string, scopes ...auth.Scope) string {
	t.Helper()
	tok, err := auth.Mint(testSecret, auth.Claims{Tenant: tenant, Scopes: scopes, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// post sends body (encoded as JSON unless it is already bytes) to a
// worker's intake and returns the status and the raw reply.
func (w *worker) post(t testing.TB, tenant, tok, contentType string, body []byte) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, w.http.URL+"/v1/tenants/"+tenant+"/transport", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

// wire is a transport message as JSON, without the schema's validation, so
// tests can send what the schema would refuse to encode.
type wire struct {
	V       int          `json:"v"`
	Group   schema.Bytes `json:"group"`
	Kind    string       `json:"kind"`
	Payload schema.Bytes `json:"payload"`
}

// submit posts transport messages as a JSON batch and returns the results.
func (w *worker) submit(t testing.TB, msgs ...schema.TransportMessage) []Result {
	t.Helper()
	ws := make([]wire, len(msgs))
	for i, m := range msgs {
		ws[i] = wire{V: m.V, Group: m.Group, Kind: string(m.Kind), Payload: m.Payload}
	}
	body, err := json.Marshal(map[string]any{"messages": ws})
	if err != nil {
		t.Fatal(err)
	}
	status, b, _ := w.post(t, testTenant, token(t, testTenant, auth.ScopeIngest), "", body)
	if status != http.StatusOK {
		t.Fatalf("intake: status %d: %s", status, b)
	}
	var r Response
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("intake reply: %v: %s", err, b)
	}
	if len(r.Results) != len(msgs) {
		t.Fatalf("got %d results for %d messages", len(r.Results), len(msgs))
	}
	return r.Results
}

func (w *worker) submitOne(t testing.TB, m schema.TransportMessage) Result {
	t.Helper()
	return w.submit(t, m)[0]
}

// outcome reads an outcome over HTTP; ok is false on 404.
func (w *worker) outcome(t testing.TB, id []byte) (schema.Outcome, bool) {
	t.Helper()
	return w.outcomeOf(t, testTenant, id)
}

// outcomeOf reads a tenant's outcome over HTTP; ok is false on 404.
func (w *worker) outcomeOf(t testing.TB, tenant string, id []byte) (schema.Outcome, bool) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, w.http.URL+"/v1/tenants/"+tenant+"/outcomes/"+hex.EncodeToString(id), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token(t, tenant, auth.ScopeIngest))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case http.StatusNotFound:
		return schema.Outcome{}, false
	case http.StatusOK:
	default:
		t.Fatalf("outcome: status %d: %s", resp.StatusCode, b)
	}
	var o schema.Outcome
	if err := o.UnmarshalJSON(b); err != nil {
		t.Fatalf("outcome: %v: %s", err, b)
	}
	return o, true
}

// wantOutcome checks the current outcome record of id.
func (w *worker) wantOutcome(t testing.TB, id []byte, status schema.OutcomeStatus, cat schema.Category, class schema.InputClass) schema.Outcome {
	t.Helper()
	o, ok := w.outcome(t, id)
	if err := outcomeIs(o, ok, status, cat, class); err != nil {
		t.Fatal(err)
	}
	return o
}

// awaitOutcome waits for an input's outcome record to be status/cat/class:
// a retried input enters FABRIC_IN before its outcome record is replaced.
func (w *worker) awaitOutcome(t testing.TB, id []byte, status schema.OutcomeStatus, cat schema.Category, class schema.InputClass) {
	t.Helper()
	eventually.NoError(t, func() error {
		o, ok := w.outcome(t, id)
		return outcomeIs(o, ok, status, cat, class)
	})
}

// outcomeIs says how an outcome record (ok: found) differs from
// status/cat/class; an empty class matches any.
func outcomeIs(o schema.Outcome, ok bool, status schema.OutcomeStatus, cat schema.Category, class schema.InputClass) error {
	if !ok {
		return errors.New("no outcome record")
	}
	if o.Status != status || o.Category != cat || (class != "" && o.Class != class) {
		return fmt.Errorf("outcome = %s/%s/%s, want %s/%s/%s", o.Status, o.Category, o.Class, status, cat, class)
	}
	return nil
}

// inputs returns every message on FABRIC_IN.
// wantInputs fails the test unless FABRIC_IN holds n inputs.
func (e *env) wantInputs(n int) {
	e.t.Helper()
	if got := len(e.inputs()); got != n {
		e.t.Fatalf("FABRIC_IN holds %d messages, want %d", got, n)
	}
}

// hostedGroup starts an environment with one worker and a group a hosted
// client holds.
func hostedGroup(t *testing.T) (*env, *worker, *testpeer.Group) {
	t.Helper()
	e := newEnv(t, envOpts{})
	g := newGroup(t)
	e.hostGroup(g.ID())
	return e, e.workers[0], g
}

func (e *env) inputs() []*jetstream.RawStreamMsg {
	e.t.Helper()
	ctx := context.Background()
	st, err := e.js.Stream(ctx, streams.StreamInput)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
		if err != nil {
			return out
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
}

// storedID is the message id of a stored input: its subject's last token.
func storedID(t testing.TB, m *jetstream.RawStreamMsg) string {
	t.Helper()
	subj, err := subject.ParseStoredInput(m.Subject)
	if err != nil {
		t.Fatal(err)
	}
	return subj.MessageIDHex
}

func (e *env) retained() uint64 {
	e.t.Helper()
	st, err := e.js.Stream(context.Background(), streams.StreamRetained)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

// hostGroup writes the fabric-groups record of a group as converge does
// when a hosted client joins it.
func (e *env) hostGroup(groupID []byte) {
	e.t.Helper()
	e.putKV(streams.BucketGroups, groupID, msgpackBody(e.t, bus.GroupRecord{Members: []string{"c1"}, CheckpointSeq: 1}))
	key := testTenant + "." + hex.EncodeToString(groupID)
	for _, w := range e.workers {
		eventually.True(e.t, "group known", func() bool { return w.svc.dir.known(key) })
	}
}

// setGroupKeys writes a group's candidate keys as converge does.
func (e *env) setGroupKeys(groupID []byte, g *testpeer.Group) {
	e.t.Helper()
	v, err := bus.SealGroupKeys(testVault, g.EventKeys())
	if err != nil {
		e.t.Fatal(err)
	}
	e.putKV(streams.BucketGroupKeys, groupID, v)
}

func (e *env) putKV(bucket string, groupID, value []byte) {
	e.t.Helper()
	ctx := context.Background()
	kv, err := e.js.KeyValue(ctx, bucket)
	if err != nil {
		e.t.Fatal(err)
	}
	key, err := subject.GroupKey(testTenant, hex.EncodeToString(groupID))
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := kv.Put(ctx, key, value); err != nil {
		e.t.Fatal(err)
	}
}

// newGroup makes a remote group of two peers and returns the creator's view.
// remoteKeyPackage is a KeyPackage of a peer no worker hosts.
func remoteKeyPackage(t testing.TB) []byte {
	t.Helper()
	bob, err := testpeer.New("bob")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := bob.KeyPackage()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// invite adds a remote peer to g and returns the Welcome.
func invite(t testing.TB, g *testpeer.Group) testpeer.Message {
	t.Helper()
	_, welcome, err := g.Invite(remoteKeyPackage(t))
	if err != nil {
		t.Fatal(err)
	}
	return welcome
}

func newGroup(t testing.TB) *testpeer.Group {
	t.Helper()
	alice, err := testpeer.New("alice")
	if err != nil {
		t.Fatal(err)
	}
	g, err := alice.CreateGroup(components.Set{})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func text(t testing.TB, g *testpeer.Group, s string) testpeer.Message {
	t.Helper()
	m, err := g.SendText(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func wantResult(t testing.TB, r Result, id []byte, status schema.OutcomeStatus, cat schema.Category) {
	t.Helper()
	if id != nil && !bytes.Equal(r.MessageID, id) {
		t.Errorf("message_id = %x, want %x", r.MessageID, id)
	}
	if r.Status != status || r.Category != cat {
		t.Fatalf("result = %s/%s, want %s/%s", r.Status, r.Category, status, cat)
	}
}

// natsRequest sends one intake request over NATS.
func (e *env) natsRequest(t testing.TB, tenant string, hdr nats.Header, body []byte) (*nats.Msg, error) {
	t.Helper()
	m := nats.NewMsg("fabric.intake." + tenant) // tenant may be invalid on purpose
	m.Data = body
	for k, v := range hdr {
		m.Header[k] = v
	}
	return e.nc.RequestMsg(m, 10*time.Second)
}

func msgpackBody(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var _ = httpapi.ContentTypeMsgpack

func decodeMsgpack(b []byte, v any) error { return msgpack.Unmarshal(b, v) }

// unhostGroup deletes the fabric-groups record as converge does when the
// last hosted member leaves.
func (e *env) unhostGroup(groupID []byte) {
	e.t.Helper()
	ctx := context.Background()
	kv, err := e.js.KeyValue(ctx, streams.BucketGroups)
	if err != nil {
		e.t.Fatal(err)
	}
	key, _ := subject.GroupKey(testTenant, hex.EncodeToString(groupID))
	if err := kv.Delete(ctx, key); err != nil {
		e.t.Fatal(err)
	}
	for _, w := range e.workers {
		eventually.True(e.t, "group unknown", func() bool { return !w.svc.dir.known(key) })
	}
}

// intakeSubject is the intake subject of a valid tenant.
func intakeSubject(tenant string) string {
	s, err := subject.Intake(tenant)
	if err != nil {
		panic(err)
	}
	return s
}
