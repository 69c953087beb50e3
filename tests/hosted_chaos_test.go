package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

var hostedChaos = flag.Bool("hosted-chaos", false, "run the long hosted-to-hosted send chaos test: 1,000 sends from one hosted client to another while converge and ingest, and separately the all-in-one, are killed with kill -9 six times each")

// TestHostedToHostedSendsExactlyOnceAcrossKills is issue 26's chaos line:
// a hosted client sends texts through the HTTP operations API to a group
// whose other member is a hosted client of the same fabric, retrying a
// request that got no answer with its Idempotency-Key, while the fabric's
// processes are killed with SIGKILL at random points and restarted. Every
// operation ends done, and the other hosted client receives every send
// exactly once, in the order it was sent (the order of the sender's
// messages on the outbound subject), as message.received events and as the
// read API's messages alike; every message's copy that came back through
// ingest is accepted, not stale_epoch nor own_echo. The sender renames
// the group now and then too, so sends wait behind its own commits.
//
// In the normal suite: 60 operations, converge killed twice (its roles as
// processes). With -args -hosted-chaos: 1,000 operations with converge
// and ingest killed six times each, then 1,000 with the all-in-one
// (`fabric run`) killed six times.
func TestHostedToHostedSendsExactlyOnceAcrossKills(t *testing.T) {
	t.Parallel()
	t.Run("roles", func(t *testing.T) {
		// Ingest dies with copies in hand, which come again after the
		// outbound consumer's 30 s AckWait, behind newer ones; converge
		// dies after it, so the receiver's state is restored before they
		// come. Twice. Converge's kills alone did not lose a send on
		// b1551bc (0 of 5 runs): its input comes back in order.
		c := hostedChaosConfig{sends: 60, senders: 4, renameEvery: 30, kills: []chaosKill{
			{"ingest", 0.1, 0.2}, {"converge", 0.25, 0.4}, {"ingest", 0.45, 0.6}, {"converge", 0.65, 0.9}}}
		if *hostedChaos {
			c = hostedChaosConfig{sends: 1000, senders: 16, renameEvery: 100, kills: slices.Concat(
				slices.Repeat([]chaosKill{{"converge", 0, 0.9}}, 6), slices.Repeat([]chaosKill{{"ingest", 0, 0.9}}, 6))}
		}
		c.run(t, startChaosRoles(t))
	})
	t.Run("all-in-one", func(t *testing.T) {
		if !*hostedChaos {
			t.Skip("run with -args -hosted-chaos")
		}
		c := hostedChaosConfig{sends: 1000, senders: 16, renameEvery: 100, kills: slices.Repeat([]chaosKill{{"fabric", 0, 0.9}}, 6)}
		c.run(t, startChaosAllInOne(t))
	})
}

// chaosFabric is a fabric whose processes a chaos test kills: its HTTP
// API, a tenant and the secret its tokens are signed with, a connection
// that reads the events and one that reads the outcomes and ingest's
// outbound consumer, and kill, which kills a role (by name) with SIGKILL
// and starts it again.
type chaosFabric struct {
	base     string
	tenant   string
	secret   []byte
	events   jetstream.JetStream
	outcomes jetstream.JetStream
	kill     func(role string)
}

// copiesInHand is how many outbound messages ingest took and has not yet
// acknowledged (0 when that cannot be read now).
func (f *chaosFabric) copiesInHand(ctx context.Context) int {
	c, err := f.outcomes.Consumer(ctx, streams.StreamEvents, streams.ConsumerOutbound)
	if err != nil {
		return 0
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0
	}
	return info.NumAckPending
}

func (f *chaosFabric) token(t *testing.T, scope auth.Scope) string {
	t.Helper()
	tok, err := auth.Mint(f.secret, auth.Claims{Tenant: f.tenant, Scopes: []auth.Scope{scope}, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// chaosSecrets are the JWT secret and the master key (the environment of
// every role) of a chaos fabric.
func chaosSecrets() ([]byte, []string) {
	secret := []byte(strings.Repeat("k", 32))
	masterKey := sha256.Sum256([]byte("hosted chaos master key"))
	return secret, []string{"FABRIC_JWT_SECRET=" + string(secret), "FABRIC_MASTER_KEY=" + hex.EncodeToString(masterKey[:])}
}

// startChaosRoles runs ingest (with the operations API, on a fixed
// address) and one converge worker as processes on an embedded NATS
// server.
func startChaosRoles(t *testing.T) *chaosFabric {
	bin := binaries(t)
	n := natstest.Start(t, natstest.OverLoopback())
	secret, env := chaosSecrets()
	env = append(env, "FABRIC_NATS_URL="+n.Server.ClientURL())
	ingestAddr := freeAddr(t)
	ingestArgs := []string{"-listen", ingestAddr, "-drain-timeout", "1s"}
	runConverge := func() *process {
		return start(t, filepath.Join(bin, "converge"), env, "-worker-id", "a", "-listen", freeAddr(t), "-lease-ttl", "2s")
	}
	ingest := start(t, filepath.Join(bin, "ingest"), env, ingestArgs...)
	waitReady(t, "http://"+ingestAddr+"/readyz", time.Minute)
	converge := runConverge()
	var mu sync.Mutex
	return &chaosFabric{
		base: "http://" + ingestAddr, tenant: "chaos", secret: secret, events: n.JS, outcomes: n.JS,
		kill: func(role string) {
			mu.Lock()
			defer mu.Unlock()
			switch role {
			case "converge":
				sigkill(converge)
				converge = runConverge()
			case "ingest":
				sigkill(ingest)
				ingest = start(t, filepath.Join(bin, "ingest"), env, ingestArgs...)
			default:
				t.Fatalf("no role %q", role)
			}
		},
	}
}

// startChaosAllInOne runs `fabric run` as a process on a data directory
// and fixed addresses, so a restart finds its streams and the app its API
// again. The test reads the events as the all-in-one's NATS user api and
// the outcomes as ingest.
func startChaosAllInOne(t *testing.T) *chaosFabric {
	bin := filepath.Join(binaries(t), "fabric")
	data := t.TempDir()
	secret, env := chaosSecrets()
	args := []string{"run", "-data", data, "-listen", freeAddr(t), "-nats-listen", freeAddr(t)}
	var url, natsURL string
	run := func() *process {
		p := start(t, bin, env, args...)
		url, natsURL = p.waitLine(t, "HTTP API", time.Minute), p.waitLine(t, "NATS", 5*time.Second)
		waitReady(t, url+"/readyz", time.Minute)
		return p
	}
	fabric := run()
	connect := func(user string) jetstream.JetStream {
		pw, err := os.ReadFile(allinone.NATSPasswordFile(data, user))
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(natsURL, nats.UserInfo(user, strings.TrimSpace(string(pw))), nats.CustomInboxPrefix(allinone.InboxPrefix(user)),
			nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
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
	var mu sync.Mutex
	return &chaosFabric{
		base: url, tenant: allinone.DevTenant, secret: secret, events: connect(allinone.UserAPI), outcomes: connect(allinone.UserIngest),
		kill: func(role string) {
			mu.Lock()
			defer mu.Unlock()
			if role != "fabric" {
				t.Fatalf("no role %q", role)
			}
			sigkill(fabric)
			fabric = run()
		},
	}
}

// hostedChaosConfig is one chaos run: operations (every renameEvery-th a
// rename), from senders at once, and how often each role is killed.
type hostedChaosConfig struct {
	sends, senders, renameEvery int
	kills                       []chaosKill
}

// chaosKill kills a role once, when a count passes a random mark between
// from and to (fractions of the operations): ingest's count is the
// operations acknowledged (it has requests and outbound copies in hand),
// the others' the messages on the outbound subject (converge has just
// stored a batch). A role that runs ingest dies when ingest has outbound
// copies in hand too, as long as sends are in flight. The kills fall in
// the order of their marks.
type chaosKill struct {
	role     string
	from, to float64
}

func (c hostedChaosConfig) run(t *testing.T, f *chaosFabric) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	began := time.Now()
	api := &demo.API{BaseURL: f.base, Tenant: f.tenant, AdminToken: f.token(t, auth.ScopeAdmin)}
	register := func(name string) demo.Registered {
		account := sha256.Sum256([]byte(name))
		return ok[demo.Registered](t)(api.Register(ctx, hex.EncodeToString(account[:])))
	}
	sender, receiver := register("hosted chaos sender"), register("hosted chaos receiver")
	ops := client.NewOperations(f.base, f.tenant, f.token(t, auth.ScopeSend), &http.Client{Timeout: 15 * time.Second})

	// The group: the sender creates it with the receiver in it, who
	// joins from the Welcome as it comes back through ingest.
	name := "hosted chaos"
	created := ok[schema.OperationAccepted](t)(ops.CreateConversation(ctx, sender.ClientID, "create", schema.CreateConversation{Name: &name, KeyPackages: []schema.Bytes{receiver.KeyPackages[0]}}))
	group := []byte(created.GroupID)
	waitOperationsDone(t, ctx, f.events, f.tenant, [][]byte{created.OperationID}, time.Minute)
	eventually.NoErrorWithin(t, time.Minute, func() error {
		evs, err := clientEventsOf(ctx, f.events, f.tenant, receiver.ClientID)
		if err == nil && (len(evs) == 0 || evs[0].Event.Kind != schema.KindConversationJoined) {
			err = fmt.Errorf("the receiver has not joined: %d events", len(evs))
		}
		return err
	})
	outSubj := ok[string](t)(subject.Outbound(f.tenant, hex.EncodeToString(group)))
	events := ok[jetstream.Stream](t)(f.events.Stream(ctx, streams.StreamEvents))
	// onOutbound counts the messages on the group's outbound subject, 0
	// while the fabric is down.
	onOutbound := func() int {
		info, err := events.Info(ctx, jetstream.WithSubjectFilter(outSubj))
		if err != nil {
			return 0
		}
		return int(info.State.Subjects[outSubj])
	}

	type mark struct {
		role string
		at   int
	}
	var marks []mark
	for _, k := range c.kills {
		lo, hi := int(k.from*float64(c.sends)), int(k.to*float64(c.sends))
		marks = append(marks, mark{k.role, 1 + lo + rand.IntN(max(hi-lo, 1))})
	}
	slices.SortStableFunc(marks, func(a, b mark) int { return a.at - b.at })
	var acked atomic.Int64
	opIDs := make([][]byte, c.sends)
	var retries atomic.Int64
	work := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, c.senders)
	for range c.senders {
		wg.Go(func() {
			for i := range work {
				key := fmt.Sprintf("send-%d", i)
				op := func() (schema.OperationAccepted, error) {
					return ops.SendText(ctx, sender.ClientID, group, key, chaosText(i))
				}
				if i%c.renameEvery == c.renameEvery-1 {
					key = fmt.Sprintf("rename-%d", i)
					name := fmt.Sprintf("hosted chaos %d", i)
					op = func() (schema.OperationAccepted, error) {
						return ops.UpdateConversation(ctx, sender.ClientID, group, key, schema.ConversationChanges{Name: &name})
					}
				}
				for {
					a, err := op()
					if err == nil {
						opIDs[i] = a.OperationID
						acked.Add(1)
						break
					}
					var apiErr *client.APIError
					if errors.As(err, &apiErr) && apiErr.Status < 500 && apiErr.Status != http.StatusTooManyRequests || ctx.Err() != nil {
						errs <- fmt.Errorf("operation %d: %w", i, err)
						return
					}
					// No answer, or not stored: the same key again.
					retries.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	go func() {
		defer close(work)
		for i := range c.sends {
			select {
			case work <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	killed := map[string]int{}
	killsBy := time.Now().Add(5 * time.Minute)
	for len(marks) > 0 {
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		if time.Now().After(killsBy) {
			t.Fatalf("%d acknowledged after 5 minutes; kills left %v", acked.Load(), marks)
		}
		count := onOutbound() - 2 // the create's commit and Welcome
		if marks[0].role == "ingest" {
			count = int(acked.Load())
		}
		// A role that runs ingest dies with outbound copies in hand
		// while there are any to take.
		inHand := marks[0].role == "converge" || int(acked.Load()) == c.sends || f.copiesInHand(ctx) > 0
		if count >= marks[0].at && inHand {
			f.kill(marks[0].role)
			killed[marks[0].role]++
			marks = marks[1:]
		}
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	acknowledged := time.Since(began)

	// Every operation ends done; the sender's application messages on the
	// outbound subject, in order, are what the receiver must hold.
	var sendIDs, renameIDs [][]byte
	for i, id := range opIDs {
		if i%c.renameEvery == c.renameEvery-1 {
			renameIDs = append(renameIDs, id)
		} else {
			sendIDs = append(sendIDs, id)
		}
	}
	waitOperationsDone(t, ctx, f.events, f.tenant, renameIDs, 3*time.Minute)
	named := map[string]bool{}
	for _, r := range waitOperationsDone(t, ctx, f.events, f.tenant, sendIDs, 3*time.Minute) {
		if r.Kind != schema.OpSendMessage || len(r.MessageIDs) != 1 {
			t.Fatalf("send record %+v", r)
		}
		named[hex.EncodeToString(r.MessageIDs[0])] = true
	}
	var want []string
	for _, m := range storedOn(t, ctx, f.events, outSubj) {
		if m.Header.Get(bus.HeaderClass) == string(schema.ClassApplication) {
			want = append(want, m.Header.Get(bus.HeaderMessageID))
		}
	}
	if len(want) != len(sendIDs) {
		t.Fatalf("%d application messages on the outbound subject for %d sends", len(want), len(sendIDs))
	}
	for _, id := range want {
		if !named[id] {
			t.Fatalf("outbound message %s is no send's", id)
		}
	}

	// Once every copy came back and was decided, the receiver's events
	// are final: a copy that comes back later could still deliver.
	undecided := want
	eventually.NoErrorWithin(t, 3*time.Minute, func() error {
		var err error
		undecided, err = undecidedOf(ctx, f.outcomes, f.tenant, undecided)
		if err == nil && len(undecided) > 0 {
			o, oerr := outcomeRecord(ctx, f.outcomes, f.tenant, undecided[0])
			err = fmt.Errorf("%d of %d copies undecided, the first %s: outcome %+v (%v)", len(undecided), len(want), undecided[0], o, oerr)
		}
		return err
	})
	decided := time.Since(began)
	notAccepted := map[string]int{}
	for _, id := range want {
		o, err := outcomeRecord(ctx, f.outcomes, f.tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		if o.Disposition != schema.DispositionAccepted {
			notAccepted[fmt.Sprintf("%s/%s/%s", o.Status, o.Disposition, o.Category)]++
		}
	}
	if len(notAccepted) > 0 {
		t.Errorf("copies that came back not accepted, by outcome: %v", notAccepted)
	}
	evs, err := clientEventsOf(ctx, f.events, f.tenant, receiver.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	ids := map[string]bool{}
	for _, d := range evs {
		if ids[d.ID] {
			t.Errorf("event id %s twice", d.ID)
		}
		ids[d.ID] = true
		if r := d.Event.MessageReceived; r != nil {
			got = append(got, hex.EncodeToString(r.MessageID))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("the receiver got %d message.received, want the %d sends once each, in order: %s", len(got), len(want), orderDiff(got, want))
	}
	readable, err := readableMessages(ctx, f.events, f.tenant, group)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(readable, want) {
		t.Errorf("the read API holds %d messages, want the %d sends once each, in order: %s", len(readable), len(want), orderDiff(readable, want))
	}
	t.Logf("%d operations (%d renames) from %d senders, kills %v, %d requests sent again: acknowledged in %s, every copy decided in %s; the receiver got %d of %d sends",
		c.sends, len(renameIDs), c.senders, killed, retries.Load(), acknowledged.Round(time.Millisecond), decided.Round(time.Millisecond), len(got), len(want))
}

// orderDiff says how got differs from want: what is missing, what is
// there twice, and the first place the order differs.
func orderDiff(got, want []string) string {
	count := map[string]int{}
	for _, id := range got {
		count[id]++
	}
	var missing, twice int
	for _, id := range want {
		switch count[id] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	first := -1
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			first = i
			break
		}
	}
	return fmt.Sprintf("%d missing, %d more than once, first out of place at %d", missing, twice, first)
}

// clientEventsOf reads every converge event stored for a client.
func clientEventsOf(ctx context.Context, js jetstream.JetStream, tenant, client string) ([]bus.Delivered, error) {
	subj, err := subject.Events(tenant, client)
	if err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, streams.StreamEvents)
	if err != nil {
		return nil, err
	}
	var out []bus.Delivered
	for seq := uint64(1); ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		d, err := bus.DecodeStored(m)
		if err != nil {
			return nil, err
		}
		if d.Event.Kind != schema.KindIdentityRegistered {
			out = append(out, d)
		}
		seq = m.Sequence + 1
	}
}

// outcomeRecord reads a message's current outcome record.
func outcomeRecord(ctx context.Context, js jetstream.JetStream, tenant, idHex string) (schema.Outcome, error) {
	var o schema.Outcome
	subj, err := subject.Outcome(tenant, idHex)
	if err != nil {
		return o, err
	}
	s, err := js.Stream(ctx, streams.StreamOutcomes)
	if err != nil {
		return o, err
	}
	m, err := s.GetLastMsgForSubject(ctx, subj)
	if err != nil {
		return o, err
	}
	return o, o.UnmarshalMsgpack(m.Data)
}

// undecidedOf returns the messages of ids whose outcome is not decided
// yet: no record, queued without a disposition, or deferred.
func undecidedOf(ctx context.Context, js jetstream.JetStream, tenant string, ids []string) ([]string, error) {
	var out []string
	for _, id := range ids {
		o, err := outcomeRecord(ctx, js, tenant, id)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			out = append(out, id)
			continue
		}
		if err != nil {
			return ids, err
		}
		if o.Status != schema.StatusRejected && (o.Disposition == "" || o.Disposition == schema.DispositionDeferred) {
			out = append(out, id)
		}
	}
	return out, nil
}

// readableMessages are the ids of a group's readable message records in
// the order of their delivery numbers (the read API's messages).
func readableMessages(ctx context.Context, js jetstream.JetStream, tenant string, group []byte) ([]string, error) {
	s, err := js.Stream(ctx, streams.StreamEvents)
	if err != nil {
		return nil, err
	}
	var ids []string
	for n := uint64(1); ; n++ {
		subj, err := readmodel.MessageSubject(tenant, hex.EncodeToString(group), n)
		if err != nil {
			return nil, err
		}
		raw, err := s.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return ids, nil
		}
		if err != nil {
			return nil, err
		}
		var rec readmodel.Message
		if err := schema.UnmarshalMsgpack(raw.Data, &rec); err != nil {
			return nil, err
		}
		if rec.State != readmodel.StateDelivered {
			return nil, fmt.Errorf("readable message %d is %s", n, rec.State)
		}
		ids = append(ids, hex.EncodeToString(rec.ID))
	}
}
