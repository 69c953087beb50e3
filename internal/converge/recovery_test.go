package converge

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// groupWithHosted creates a remote group that invites the hosted clients
// and publishes the Welcome.
func groupWithHosted(t *testing.T, e *env, set components.Set, hs ...hosted) (*testpeer.Peer, *testpeer.Group) {
	t.Helper()
	alice := peer(t, "alice")
	if set.Admins == nil {
		set.Admins = []components.AccountID{alice.AccountID()}
	}
	g := must[*testpeer.Group](t)(alice.CreateGroup(set))
	var kps [][]byte
	for _, h := range hs {
		kps = append(kps, h.kps[0])
	}
	_, welcome, err := g.Invite(kps...)
	if err != nil {
		t.Fatal(err)
	}
	e.publish(welcome)
	return alice, g
}

func uniqueIDs(t *testing.T, evs []bus.Delivered) {
	t.Helper()
	seen := map[string]bool{}
	for _, d := range evs {
		if seen[d.ID] {
			t.Fatalf("event id repeated: %s", d.Event.Kind)
		}
		seen[d.ID] = true
	}
}

// TestRedeliveryEmitsNothingTwice_EVENT001: a worker that restarts with its
// consumer rewound to the start of the stream (a crash before any ack)
// re-reads every input, and the checkpoints make each one count once.
func TestRedeliveryEmitsNothingTwice_EVENT001(t *testing.T) {
	t.Parallel()
	// With SnapshotEvery 4 the member state read back is older than the
	// checkpoint and ratchets forward to the next message.
	for _, every := range []int{1, 4} {
		t.Run(fmt.Sprintf("snapshot-every-%d", every), func(t *testing.T) {
			t.Parallel()
			redelivery(t, every)
		})
	}
}

func redelivery(t *testing.T, every int) {
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	snap := func(c *Config) { c.SnapshotEvery = every }
	_, stop := e.worker("w1", snap)
	_, g := groupWithHosted(t, e, components.Set{}, h)
	for range 3 {
		e.publish(must[testpeer.Message](t)(g.SendText("x")))
	}
	e.waitEvents(h.rec.ClientID, 4)
	stop()

	rewind(t, e)
	for range 2 {
		e.publish(must[testpeer.Message](t)(g.SendText("y")))
	}
	e.worker("w2", snap)
	e.waitEvents(h.rec.ClientID, 6)
	e.quiet(g.ID())
	evs := e.waitEvents(h.rec.ClientID, 6)
	uniqueIDs(t, evs)
	if evs[0].Event.Kind != schema.KindConversationJoined {
		t.Fatalf("first event %s", evs[0].Event.Kind)
	}
}

// TestStaleWorkerCannotEmit: a commit against a checkpoint another worker
// has moved past is refused as a whole; none of its events is stored.
func TestStaleWorkerCannotEmit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	_, stop := e.worker("w1", nil)
	_, g := groupWithHosted(t, e, components.Set{}, h)
	groupHex := hex.EncodeToString(g.ID())
	e.waitEvents(h.rec.ClientID, 1)
	_, before, err := readCheckpoint(e.ctx, e.js, tenant, groupHex)
	if err != nil || before == 0 {
		t.Fatalf("checkpoint %d, %v", before, err)
	}
	e.publish(must[testpeer.Message](t)(g.SendText("moves the checkpoint")))
	e.waitEvents(h.rec.ClientID, 2)
	stop()

	// A paused worker wakes up holding the first checkpoint's sequence.
	ev := bus.Event{Tenant: tenant, ClientID: h.rec.ClientID, ID: bus.EventID([]byte("zombie")),
		Event: &schema.ClientEvent{Kind: schema.KindMessageExpired, MessageExpired: &schema.MessageRef{GroupID: g.ID(), MessageID: make([]byte, 32)}}}
	_, err = commitBatch(e.ctx, e.js, bus.DefaultMaxBatch, tenant, groupHex, before, checkpoint{InputSeq: 99, Worker: "zombie"}, []bus.Event{ev}, nil)
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("stale commit: %v, want ErrFenced", err)
	}
	if n := len(e.events(h.rec.ClientID)); n != 2 {
		t.Fatalf("%d events after the stale commit, want 2", n)
	}
	if ck, _, _ := readCheckpoint(e.ctx, e.js, tenant, groupHex); ck.Worker == "zombie" {
		t.Fatal("stale checkpoint stored")
	}
}

// TestFailoverToSecondWorker: a worker that dies holding every partition
// (its leases stay until they expire) is replaced by a second one within
// 10 s, which carries on with the group in order.
//
// It bounds a time, so it runs alone, not beside the parallel tests.
func TestFailoverToSecondWorker(t *testing.T) {
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	w1, err := New(e.ctx, Config{JS: e.js, MLS: EngineMLS{Vault: e.vault}, WorkerID: "dies", LeaseTTL: 3 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	if err := w1.balance(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(w1.Owned()); n != subject.Partitions {
		t.Fatalf("first worker owns %d partitions", n)
	}
	_, g := groupWithHosted(t, e, components.Set{}, h)
	e.waitEvents(h.rec.ClientID, 1)
	// Death: the partitions stop, the leases are neither renewed nor released.
	w1.stop(w1.Owned()...)
	cancel()
	w2, _ := e.worker("survives", func(c *Config) { c.LeaseTTL = 3 * time.Second })
	died := time.Now()
	e.publish(must[testpeer.Message](t)(g.SendText("after the failover")))
	e.waitEvents(h.rec.ClientID, 2)
	// Every partition of the dead worker moves within 10 s, not only the
	// one whose group had input.
	eventually.Within(t, 10*time.Second-time.Since(died), "the second worker owns every partition", func() bool {
		return len(w2.Owned()) == subject.Partitions
	})
}

// TestDMJoinedWithConversationKey_EVENT020: a DM's events carry its
// conversation key header, the same for every group of the DM.
func TestDMJoinedWithConversationKey_EVENT020(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bob := peer(t, "bob")
	h := e.register(bob.AccountID(), 2)
	e.worker("w1", nil)
	alice := peer(t, "alice")
	dm := components.NewDM(alice.AccountID(), bob.AccountID())
	var keys [][]byte
	for i := range 2 {
		g := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}, Conversation: &dm}))
		_, welcome, err := g.Invite(h.kps[i])
		if err != nil {
			t.Fatal(err)
		}
		e.publish(welcome)
		evs := e.waitEvents(h.rec.ClientID, i+1)
		j := evs[i].Event.ConversationJoined
		if j == nil || j.ConversationType != schema.ConversationDM || j.Origin != schema.OriginWelcomed || *j.AdderInboxID != alice.InboxID() {
			t.Fatalf("joined %+v", j)
		}
		keys = append(keys, evs[i].ConversationKey)
	}
	if len(keys[0]) == 0 || string(keys[0]) != string(keys[1]) {
		t.Fatal("the DM's groups do not share one conversation key")
	}
}

// TestDisappearingMessages_META063: a message under disappearing messages
// is received, then expired by the cleanup pass; one whose expiry passed
// before it was processed is never received.
func TestDisappearingMessages_META063(t *testing.T) {
	t.Parallel()
	const disappearing = 1
	e := newEnv(t)
	clock := &testClock{}
	h := e.register(peer(t, "bob").AccountID(), 1)
	_, g := groupWithHosted(t, e, components.Set{Retention: &components.RetentionState{DisappearingSecs: disappearing}}, h)
	late := must[testpeer.Message](t)(g.SendText("expires before converge runs"))
	e.publish(late)
	// The worker first runs past the late message's expiry.
	clock.run(disappearing*time.Second + time.Second)
	e.worker("w1", func(c *Config) { c.Now = clock.Now })
	e.waitEvents(h.rec.ClientID, 2) // joined, the late message expired
	clock.hold()
	m := must[testpeer.Message](t)(g.SendText("soon gone"))
	e.publish(m)
	e.waitEvents(h.rec.ClientID, 3)
	// Past the expiry of m, and past the last cleanup pass, which ran on
	// the clock ahead.
	clock.run(2 * (disappearing*time.Second + time.Second))
	evs := e.waitEvents(h.rec.ClientID, 4)
	gid := schema.Bytes(g.ID())
	if evs[0].Event.Kind != schema.KindConversationJoined {
		t.Fatalf("first event %s", evs[0].Event.Kind)
	}
	pos := map[string]int{}
	for i, d := range evs[1:] {
		switch d.Event.Kind {
		case schema.KindMessageReceived:
			if !d.Event.MessageReceived.MessageID.Equal(m.ID) {
				t.Fatal("received a message that had expired before it was processed")
			}
			pos["received"] = i + 1
		case schema.KindMessageExpired:
			if !d.Event.MessageExpired.GroupID.Equal(gid) {
				t.Fatal("expired names another group")
			}
			pos["expired "+d.Event.MessageExpired.MessageID.String()] = i + 1
		}
	}
	if pos["received"] == 0 || pos["expired "+schema.Bytes(late.ID).String()] == 0 || pos["expired "+schema.Bytes(m.ID).String()] <= pos["received"] {
		t.Fatalf("events %v", kinds(evs))
	}
}

// TestOutcomeDispositions records every disposition under branch
// selection (the default): a message ahead of its commit is deferred, then
// accepted once the commit arrives (and only then received); a message of
// the previous epoch is still inside the app-payload window
// (app_payload_past_epoch_limit 5) and is delivered; a commit by a non-admin
// changing components is a terminal authorization_failed with no event; a
// Welcome for no hosted KeyPackage is wrong_recipient.
func TestOutcomeDispositions(t *testing.T) {
	t.Parallel()
	outcomeDispositions(t, nil, dispositionsWant{
		aheadCategory: "", // deferred waiting for its epoch; missing_history is for lost retained state
		old:           schema.DispositionAccepted,
		oldCategory:   "",
		events:        3,
	})
}

type dispositionsWant struct {
	aheadCategory schema.Category
	old           schema.Disposition
	oldCategory   schema.Category
	events        int // joined, ahead received, and old received if delivered
}

func outcomeDispositions(t *testing.T, cfg func(*Config), want dispositionsWant) {
	e := newEnv(t)
	h := e.register(peer(t, "hosted").AccountID(), 1)
	alice, bob, carol := peer(t, "alice"), peer(t, "bob"), peer(t, "carol")
	e.worker("w1", cfg)
	ga := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}}))
	kpBob := must[[]byte](t)(bob.KeyPackage())
	_, welcome, err := ga.Invite(h.kps[0], kpBob)
	if err != nil {
		t.Fatal(err)
	}
	gb := must[*testpeer.Group](t)(bob.Join(welcome.Transport))
	e.publish(welcome)

	old := must[testpeer.Message](t)(ga.SendText("sent in epoch 1"))
	commit := must[testpeer.Message](t)(ga.Commit())
	ahead := must[testpeer.Message](t)(ga.SendText("sent in epoch 2"))
	e.publish(ahead)
	if o := e.outcome(ahead.ID); o.Disposition != schema.DispositionDeferred || o.Category != want.aheadCategory {
		t.Fatalf("ahead: %+v, want deferred %q", o, want.aheadCategory)
	}
	e.publish(commit)
	e.publish(old)
	evs := e.waitEvents(h.rec.ClientID, want.events)
	received := map[string]bool{}
	for _, d := range evs[1:] {
		if r := d.Event.MessageReceived; r != nil {
			received[r.MessageID.String()] = true
		}
	}
	if !received[schema.Bytes(ahead.ID).String()] {
		t.Fatalf("no message.received for the message ahead: %v", kinds(evs))
	}
	// Outcome records are stored after the events they go with.
	if o := e.settledOutcome(ahead.ID); o.Disposition != schema.DispositionAccepted || o.Revision < 2 {
		t.Fatalf("ahead after the commit: %+v", o)
	}
	if o := e.settledOutcome(old.ID); o.Disposition != want.old || o.Category != want.oldCategory {
		t.Fatalf("old: %+v, want %s %q", o, want.old, want.oldCategory)
	}

	// bob is no admin: renaming the group is refused, terminally.
	process(t, commit, gb)
	rename := must[testpeer.Message](t)(gb.SetComponents(components.Set{Profile: &components.ProfileState{Name: "bob's"}, Admins: []components.AccountID{alice.AccountID()}}))
	e.publish(rename)
	if o := e.outcome(rename.ID); o.Status != schema.StatusRejected || o.Category != schema.CategoryAuthorizationFailed {
		t.Fatalf("rename: %+v, want rejected authorization_failed", o)
	}

	gc := must[*testpeer.Group](t)(carol.CreateGroup(components.Set{Admins: []components.AccountID{carol.AccountID()}}))
	_, stray, err := gc.Invite(must[[]byte](t)(peer(t, "dave").KeyPackage()))
	if err != nil {
		t.Fatal(err)
	}
	e.publish(stray)
	if o := e.outcome(stray.ID); o.Status != schema.StatusRejected || o.Category != schema.CategoryWrongRecipient {
		t.Fatalf("stray welcome: %+v, want rejected wrong_recipient", o)
	}
	if n := len(e.events(h.rec.ClientID)); n != want.events {
		t.Fatalf("%d events, want %d: %v", n, want.events, kinds(e.events(h.rec.ClientID)))
	}
}

// TestExpiryAfterTakeover_META063: the cleanup pass of a group whose owner
// drained before its message expired runs on the next owner, with no new
// input to the group.
func TestExpiryAfterTakeover_META063(t *testing.T) {
	t.Parallel()
	const disappearing = 1
	e := newEnv(t)
	clock := &testClock{}
	now := func(c *Config) { c.Now = clock.Now }
	h := e.register(peer(t, "bob").AccountID(), 1)
	_, stop := e.worker("w1", now)
	_, g := groupWithHosted(t, e, components.Set{Retention: &components.RetentionState{DisappearingSecs: disappearing}}, h)
	e.waitEvents(h.rec.ClientID, 1)
	// w1 drains before the message expires: its clock stops first.
	clock.hold()
	m := must[testpeer.Message](t)(g.SendText("expires later"))
	e.publish(m)
	e.waitEvents(h.rec.ClientID, 2)
	stop()
	clock.run(disappearing*time.Second + time.Second)
	e.worker("w2", now)
	evs := e.waitEvents(h.rec.ClientID, 3)
	if x := evs[2].Event.MessageExpired; x == nil || !x.MessageID.Equal(m.ID) {
		t.Fatalf("third event %s", describe(evs[2].Event))
	}
}

// TestEveryPartitionOwned: workers with different partition sets (one may
// own all, the other half) still leave no partition to nobody, and no
// partition has two owners.
//
// A balance round slowed past the lease TTL lets a lease expire while it
// is held, so it runs alone, not beside the parallel tests.
func TestEveryPartitionOwned(t *testing.T) {
	e := newEnv(t)
	var half []int
	for p := range subject.Partitions / 2 {
		half = append(half, p)
	}
	// Leases balance every third of the TTL, and a free partition is
	// adopted after four rounds: short leases settle the two quickly.
	short := func(c *Config) { c.LeaseTTL = 1500 * time.Millisecond }
	wa, _ := e.worker("all", short)
	wb, _ := e.worker("half", func(c *Config) { short(c); c.Partitions = half })
	eventually.NoError(t, func() error {
		a, b := wa.Owned(), wb.Owned()
		overlap := false
		for _, p := range b {
			if slices.Contains(a, p) {
				overlap = true
			}
		}
		// The half worker holds some of its set, the other worker the rest:
		// its share and the orphans it adopted.
		if overlap || len(b) == 0 || len(a)+len(b) != subject.Partitions {
			return fmt.Errorf("owned %d + %d partitions, overlap %v", len(a), len(b), overlap)
		}
		return nil
	})
}

// TestSharedBatchAcrossGroups: groups of one partition share atomic
// batches, each behind its own checkpoint fence, and every client still
// gets exactly its group's events in order.
func TestSharedBatchAcrossGroups(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	alice := peer(t, "alice")
	ga, gb := groupsOfOnePartition(t, alice)
	ha, hb := e.register(peer(t, "a").AccountID(), 1), e.register(peer(t, "b").AccountID(), 1)
	var sent [2][][]byte
	for _, gh := range []struct {
		g *testpeer.Group
		h hosted
	}{{ga, ha}, {gb, hb}} {
		_, welcome, err := gh.g.Invite(gh.h.kps[0])
		if err != nil {
			t.Fatal(err)
		}
		e.publish(welcome)
	}
	for range 20 {
		for i, g := range []*testpeer.Group{ga, gb} {
			m := must[testpeer.Message](t)(g.SendText("x"))
			sent[i] = append(sent[i], m.ID)
			e.publish(m)
		}
	}
	m := NewMetrics(nil)
	e.worker("w1", func(c *Config) { c.Metrics = m })
	for i, h := range []hosted{ha, hb} {
		evs := e.waitEvents(h.rec.ClientID, 21)
		for j, id := range sent[i] {
			if r := evs[j+1].Event.MessageReceived; r == nil || !r.MessageID.Equal(id) {
				t.Fatalf("client %d event %d is not message %d", i, j+1, j)
			}
		}
	}
	if n := testutil.ToFloat64(m.Batches.WithLabelValues("many")); n < 1 {
		t.Fatal("no batch held more than one group")
	}
}

// TestSharedBatchFencedAsAWhole: one stale checkpoint in a shared batch
// refuses the whole batch; the other group's events are not stored either.
func TestSharedBatchFencedAsAWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	_, stop := e.worker("w1", nil)
	_, g := groupWithHosted(t, e, components.Set{}, h)
	e.waitEvents(h.rec.ClientID, 1)
	stop()
	groupHex := hex.EncodeToString(g.ID())
	_, cur, err := readCheckpoint(e.ctx, e.js, tenant, groupHex)
	if err != nil || cur == 0 {
		t.Fatalf("checkpoint %d, %v", cur, err)
	}
	w, err := New(e.ctx, Config{JS: e.js, MLS: EngineMLS{Vault: e.vault}, WorkerID: "zombie", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ev := func(id string) bus.Event {
		return bus.Event{Tenant: tenant, ClientID: h.rec.ClientID, ID: bus.EventID([]byte(id)),
			Event: &schema.ClientEvent{Kind: schema.KindMessageExpired, MessageExpired: &schema.MessageRef{GroupID: g.ID(), MessageID: make([]byte, 32)}}}
	}
	fresh := &staged{g: &loadedGroup{tenant: tenant, groupHex: "ab", ckSeq: 0}, next: checkpoint{InputSeq: 1}, events: []bus.Event{ev("fresh")}}
	stale := &staged{g: &loadedGroup{tenant: tenant, groupHex: groupHex, ckSeq: cur - 1}, next: checkpoint{InputSeq: 99}, events: []bus.Event{ev("stale")}}
	if _, err := w.commitMany(e.ctx, []*staged{fresh, stale}); !errors.Is(err, ErrFenced) {
		t.Fatalf("shared batch with a stale checkpoint: %v, want ErrFenced", err)
	}
	if n := len(e.events(h.rec.ClientID)); n != 1 {
		t.Fatalf("%d events, want 1: the refused batch stored some", n)
	}
	if _, seq, _ := readCheckpoint(e.ctx, e.js, tenant, "ab"); seq != 0 {
		t.Fatal("the fresh group's checkpoint was stored")
	}
}

// Issue 27: converge's user may purge nothing, so a group's superseded
// checkpoints and consumed expiry pages go by rollups of their subjects:
// after several commits and an expiry the group's checkpoint subject holds
// one checkpoint, and its expiry pages only the page not yet consumed.
func TestCheckpointsAndConsumedPagesGoWithoutPurge(t *testing.T) {
	t.Parallel()
	const disappearing = 1
	e := newEnv(t)
	clock := &testClock{}
	h := e.register(peer(t, "bob").AccountID(), 1)
	e.worker("w1", func(c *Config) { c.Now = clock.Now })
	_, g := groupWithHosted(t, e, components.Set{Retention: &components.RetentionState{DisappearingSecs: disappearing}}, h)
	e.waitEvents(h.rec.ClientID, 1)
	clock.hold()
	e.publish(must[testpeer.Message](t)(g.SendText("first")))
	e.waitEvents(h.rec.ClientID, 2)
	clock.run(2 * (disappearing*time.Second + time.Second))
	e.waitEvents(h.rec.ClientID, 3) // first expired: its page consumed
	clock.hold()
	e.publish(must[testpeer.Message](t)(g.SendText("second")))
	e.waitEvents(h.rec.ClientID, 4)

	ck := must[string](t)(subject.Checkpoint(tenant, hex.EncodeToString(g.ID())))
	s := must[jetstream.Stream](t)(e.js.Stream(e.ctx, streams.StreamEvents))
	count := func(subj string) uint64 {
		info, err := s.Info(e.ctx, jetstream.WithSubjectFilter(subj))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[subj]
	}
	if n := count(ck); n != 1 {
		t.Errorf("the group's checkpoint subject holds %d messages, want its one checkpoint", n)
	}
	if n := count(pageSubject(ck, disappearing)); n != 1 {
		t.Errorf("the group's expiry pages: %d, want the one of the second message", n)
	}
}
