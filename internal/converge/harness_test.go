package converge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/ingest"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

const tenant = "acme"

// serverCPUs, when set, runs each test's nats-server in a process of its
// own pinned to these CPUs (`taskset -c`), as deployments run it, so the
// test process's CPU and memory are converge's alone (Figures in
// docs/converge.md); empty, the server is embedded in the test process.
var serverCPUs = flag.String("converge-server-cpus", "", "run each nats-server in its own process pinned to these CPUs (taskset -c list), e.g. 1; empty: embedded")

// env is one test's fabric: an embedded JetStream server with the streams
// provisioned, a client store and the vault converge opens installations
// with.
type env struct {
	t   testing.TB
	ctx context.Context
	srv *natsserver.Server // nil under -converge-server-cpus
	// server is the nats-server's process under -converge-server-cpus.
	server *os.Process
	nc     *nats.Conn
	js     jetstream.JetStream
	vault  *engine.Vault
	store  *clientstore.Store
	// hooks are given to each worker the env starts from then on.
	hooks hooks
	// read holds the messages of each subject of FABRIC_EV read so far
	// (a client's events, a group's outbound messages): those subjects are
	// only ever appended to, so each poll reads only the new ones.
	read   map[string]*readMsgs
	readMu sync.Mutex
}

// readMsgs are a subject's messages read so far, decoded, and the stream
// sequence to read on from.
type readMsgs struct {
	msgs []any
	next uint64
}

// stored returns the messages stored on subj of FABRIC_EV so far, each
// decoded by decode, in order; decode drops a message when it returns
// false. Every call for one subject must pass the same decode.
func (e *env) stored(subj string, decode func(*jetstream.RawStreamMsg) (any, bool)) []any {
	e.t.Helper()
	s, err := e.js.Stream(e.ctx, streams.StreamEvents)
	if err != nil {
		e.t.Fatal(err)
	}
	e.readMu.Lock()
	defer e.readMu.Unlock()
	r := e.read[subj]
	if r == nil {
		r = &readMsgs{next: 1}
		e.read[subj] = r
	}
	for {
		m, err := s.GetMsg(e.ctx, r.next, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return slices.Clone(r.msgs)
		}
		if err != nil {
			e.t.Fatal(err)
		}
		if v, ok := decode(m); ok {
			r.msgs = append(r.msgs, v)
		}
		r.next = m.Sequence + 1
	}
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvWithin(t, 2*time.Minute)
}

// newEnvWithin is newEnv for a test that may take longer than two minutes.
func newEnvWithin(t testing.TB, d time.Duration) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	opt := natstest.OverLoopback()
	if *serverCPUs != "" {
		opt = natstest.InChildProcess(*serverCPUs)
	}
	n := natstest.Start(t, opt)
	srv, nc, js := n.Server, n.Conn, n.JS
	key := sha256.Sum256([]byte("converge test master key"))
	vault, err := engine.NewVault(key[:])
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := auth.NewVerifier([]byte(strings.Repeat("s", 32)))
	if err != nil {
		t.Fatal(err)
	}
	store, err := clientstore.New(ctx, clientstore.Config{JS: js, Vault: vault, Verifier: verifier, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, ctx: ctx, srv: srv, server: n.Process, nc: nc, js: js, vault: vault, store: store, read: map[string]*readMsgs{}}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// hosted is a hosted client and the KeyPackages it handed out.
type hosted struct {
	rec clientstore.Record
	kps [][]byte
}

// register hosts a client of the given account (a testpeer account, so
// remote installations of the same inbox can exist).
func (e *env) register(account [32]byte, n int) hosted {
	e.t.Helper()
	rec, kps, err := e.store.RegisterClient(e.ctx, tenant, clientstore.RegisterRequest{InboxID: hex.EncodeToString(account[:]), KeyPackages: &n})
	if err != nil {
		e.t.Fatal(err)
	}
	return hosted{rec: rec, kps: kps}
}

// invited makes a group administered by admin and a Welcome of h into it,
// to h's first KeyPackage.
func (e *env) invited(admin *testpeer.Peer, h hosted) (*testpeer.Group, testpeer.Message) {
	e.t.Helper()
	g, err := admin.CreateGroup(components.Set{Admins: []components.AccountID{admin.AccountID()}})
	if err != nil {
		e.t.Fatal(err)
	}
	_, welcome, err := g.Invite(h.kps[0])
	if err != nil {
		e.t.Fatal(err)
	}
	return g, welcome
}

// publishCommits publishes n empty commits of g, each on the last, and
// returns the last.
func (e *env) publishCommits(g *testpeer.Group, n int) testpeer.Message {
	e.t.Helper()
	var last testpeer.Message
	for range n {
		last = must[testpeer.Message](e.t)(g.Commit())
		e.publish(last)
	}
	return last
}

// publish puts a peer's message onto FABRIC_IN the way ingest does.
func (e *env) publish(m testpeer.Message) {
	e.t.Helper()
	c, err := engine.Classify(m.MLS)
	if err != nil {
		e.t.Fatal(err)
	}
	idHex := hex.EncodeToString(m.ID)
	subj, err := subject.Input(tenant, hex.EncodeToString(m.Transport.Group), idHex)
	if err != nil {
		e.t.Fatal(err)
	}
	msg := nats.NewMsg(subj)
	msg.Data = m.MLS
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	msg.Header.Set(bus.HeaderClass, string(c.Class))
	msg.Header.Set(bus.HeaderMessageID, idHex)
	if _, err := e.js.PublishMsg(e.ctx, msg); err != nil {
		e.t.Fatal(err)
	}
}

// worker starts a converge worker and returns a stop function that waits
// for it to drain.
func (e *env) worker(id string, cfg func(*Config)) (*Worker, func()) {
	e.t.Helper()
	h := e.hooks
	// A test's worker has the default lease TTL and cleanup interval: each
	// worker renews its 64 leases and polls its 64 partitions at their
	// pace, and shorter ones cost CPU that tests running side by side
	// lack. The benchmarks keep those their figures were measured with
	// (docs/benchmarks.md).
	c := Config{JS: e.js, MLS: EngineMLS{Vault: e.vault}, WorkerID: id, Logger: quiet(), hooks: &h}
	if _, bench := e.t.(*testing.B); bench {
		c.LeaseTTL, c.CleanupInterval = 1500*time.Millisecond, 200*time.Millisecond
	}
	if cfg != nil {
		cfg(&c)
	}
	w, err := New(e.ctx, c)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := w.Run(ctx); err != nil {
			e.t.Error(err)
		}
	}()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); wg.Wait() }) }
	e.t.Cleanup(stop)
	return w, stop
}

// testClock is a worker clock (Config.Now) the test moves: the real time
// plus ahead, held at most at until when until is set. Disappearing
// messages expire from the time the stream stored them (META-050), so
// whether one is processed before its expiry must not depend on how busy
// the machine is.
type testClock struct {
	mu    sync.Mutex
	ahead time.Duration
	until time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := time.Now().Add(c.ahead)
	if !c.until.IsZero() && n.After(c.until) {
		n = c.until
	}
	return n
}

// hold stops the clock at the real time now: a message stored after this
// call is processed before its expiry, however long that takes.
func (c *testClock) hold() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ahead, c.until = 0, time.Now()
}

// run lets the clock run again, d ahead of the real time.
func (c *testClock) run(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ahead, c.until = d, time.Time{}
}

// advance moves the clock d further ahead of the real time.
func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ahead += d
}

// events returns every converge event stored for a client so far (the
// client store's own identity.registered is left out).
func (e *env) events(clientID string) []bus.Delivered {
	e.t.Helper()
	subj, err := subject.Events(tenant, clientID)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []bus.Delivered
	for _, v := range e.stored(subj, func(m *jetstream.RawStreamMsg) (any, bool) {
		d, err := bus.DecodeStored(m)
		if err != nil {
			e.t.Fatal(err)
		}
		return d, d.Event.Kind != schema.KindIdentityRegistered
	}) {
		out = append(out, v.(bus.Delivered))
	}
	return out
}

// waitEvents waits until a client has n converge events and returns them.
func (e *env) waitEvents(clientID string, n int) []bus.Delivered {
	e.t.Helper()
	return e.waitEventsWithin(clientID, n, 20*time.Second)
}

// waitEventsWithin is waitEvents with its own timeout.
func (e *env) waitEventsWithin(clientID string, n int, timeout time.Duration) []bus.Delivered {
	e.t.Helper()
	var evs []bus.Delivered
	eventually.NoErrorWithin(e.t, timeout, func() error {
		if evs = e.events(clientID); len(evs) < n {
			return fmt.Errorf("client has %d events, want %d: %v", len(evs), n, kinds(evs))
		}
		return nil
	})
	if len(evs) != n {
		e.t.Fatalf("client has %d events, want %d: %v", len(evs), n, kinds(evs))
	}
	return evs
}

func kinds(evs []bus.Delivered) []schema.EventKind {
	out := make([]schema.EventKind, len(evs))
	for i, d := range evs {
		out[i] = d.Event.Kind
	}
	return out
}

// settledOutcome waits for an input's outcome to carry a disposition other
// than deferred, or a rejection: outcome records are stored after the
// events they go with, so a test that saw the events may read too early.
func (e *env) settledOutcome(id []byte) schema.Outcome {
	e.t.Helper()
	var o schema.Outcome
	eventually.NoError(e.t, func() error {
		o = e.outcome(id)
		if (o.Disposition == "" || o.Disposition == schema.DispositionDeferred) && o.Status != schema.StatusRejected {
			return fmt.Errorf("outcome %s/%s, not settled", o.Status, o.Disposition)
		}
		return nil
	})
	return o
}

// outcome reads an input's current outcome record.
func (e *env) outcome(id []byte) schema.Outcome {
	e.t.Helper()
	subj, err := subject.Outcome(tenant, hex.EncodeToString(id))
	if err != nil {
		e.t.Fatal(err)
	}
	s, err := e.js.Stream(e.ctx, streams.StreamOutcomes)
	if err != nil {
		e.t.Fatal(err)
	}
	var m *jetstream.RawStreamMsg
	eventually.NoErrorWithin(e.t, 10*time.Second, func() error {
		m, err = s.GetLastMsgForSubject(e.ctx, subj)
		if err != nil {
			return fmt.Errorf("no outcome: %w", err)
		}
		return nil
	})
	var o schema.Outcome
	if err := o.UnmarshalMsgpack(m.Data); err != nil {
		e.t.Fatal(err)
	}
	return o
}

// startIngest runs an ingest worker on the env's server and returns a
// function that submits one transport message through it.
func (e *env) startIngest() func(schema.TransportMessage) ingest.Result {
	e.t.Helper()
	verifier, err := auth.NewVerifier([]byte(strings.Repeat("v", 32)))
	if err != nil {
		e.t.Fatal(err)
	}
	svc, err := ingest.New(ingest.Config{Conn: e.nc, Verifier: verifier, Vault: e.vault, Logger: quiet()})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := svc.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = svc.Shutdown(e.ctx) })
	return func(m schema.TransportMessage) ingest.Result {
		e.t.Helper()
		res, err := svc.Submit(e.ctx, tenant, "test", []schema.TransportMessage{m})
		if err != nil {
			e.t.Fatal(err)
		}
		return res[0]
	}
}

// barrier publishes a new message of g and waits for it as the client's
// n-th event: a group's inputs are applied in order, so whatever was
// published to g before it has been decided.
func (e *env) barrier(g *testpeer.Group, clientID string, n int) {
	e.t.Helper()
	later := must[testpeer.Message](e.t)(g.SendText("barrier"))
	e.publish(later)
	evs := e.waitEvents(clientID, n)
	if r := evs[n-1].Event.MessageReceived; r == nil || !r.MessageID.Equal(later.ID) {
		e.t.Fatalf("event %d %s, want the barrier message", n, describe(evs[n-1].Event))
	}
	e.settledOutcome(later.ID)
}

// storedGroup reads the group state the group's checkpoint names, or nil
// when that state is not stored.
func (e *env) storedGroup(group []byte) *groupState {
	e.t.Helper()
	ck, _, err := readCheckpoint(e.ctx, e.js, tenant, hex.EncodeToString(group))
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := New(e.ctx, Config{JS: e.js, MLS: EngineMLS{Vault: e.vault}, WorkerID: "reader", Logger: quiet()})
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := w.getBlob(e.ctx, ck.State)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	g, err := decodeGroupState(b)
	if err != nil {
		e.t.Fatal(err)
	}
	return g
}

// quiet waits until a group is quiet: its partition's consumer holds no
// input not yet delivered or acknowledged (every input of the group
// published so far is applied) and the group's stored state has no
// convergence pass open or frozen (Due, docs/convergence.md). Then no
// event of the group's input is still to come.
func (e *env) quiet(group []byte) {
	e.t.Helper()
	p, err := subject.Partition(tenant, hex.EncodeToString(group))
	if err != nil {
		e.t.Fatal(err)
	}
	eventually.NoError(e.t, func() error {
		c, err := e.js.Consumer(e.ctx, streams.StreamInput, ConsumerName(p))
		if err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
		info, err := c.Info(e.ctx)
		if err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
		if info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("partition %d: %d inputs pending, %d unacknowledged", p, info.NumPending, info.NumAckPending)
		}
		if g := e.storedGroup(group); g == nil || g.Due != 0 {
			return errors.New("a convergence pass is open or frozen")
		}
		return nil
	})
}

// wantOutcomeKept fails unless an input's outcome is still was.
func (e *env) wantOutcomeKept(id []byte, was schema.Outcome) {
	e.t.Helper()
	if o := e.outcome(id); o.Disposition != was.Disposition || o.Status != was.Status || o.Revision != was.Revision {
		e.t.Fatalf("decision overwritten: %+v, was %+v", o, was)
	}
}

// hostedInvite registers a hosted client (of bob's account, one
// KeyPackage), starts converge worker w1, and has alice make a group and a
// Welcome of the client into it.
func (e *env) hostedInvite() (h hosted, alice *testpeer.Peer, g *testpeer.Group, welcome testpeer.Message) {
	e.t.Helper()
	h = e.register(peer(e.t, "bob").AccountID(), 1)
	e.worker("w1", nil)
	alice = peer(e.t, "alice")
	g, welcome = e.invited(alice, h)
	return h, alice, g, welcome
}

// bobJoined starts a worker and a group of alice's in which bob's hosted
// client has joined (its conversation.joined stored): the start of every
// test of a group's later history.
func bobJoined(t *testing.T) (e *env, client string, stop func(), alice *testpeer.Peer, g *testpeer.Group) {
	t.Helper()
	e = newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	client = h.rec.ClientID
	_, stop = e.worker("w1", nil)
	alice, g = groupWithHosted(t, e, components.Set{}, h)
	e.waitEvents(client, 1)
	return e, client, stop, alice, g
}
