package converge

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// setProfile commits a profile change.
func setProfile(p components.ProfileState, admin components.AccountID) func(*testpeer.Group) (testpeer.Message, error) {
	return func(g *testpeer.Group) (testpeer.Message, error) {
		return g.SetComponents(components.Set{Profile: &p, Admins: []components.AccountID{admin}})
	}
}

// lower returns the message of a and b with the lower id: with one
// committer and one kind of commit, the tip_digest tie-break picks it.
func lower(a, b testpeer.Message) (win, lose testpeer.Message) {
	if bytes.Compare(a.ID, b.ID) < 0 {
		return a, b
	}
	return b, a
}

// sameEpochFork starts a branch-selection worker, hosts bob in alice's
// group and publishes two competing commits from one epoch: one renames
// the group, the other sets its description. It returns the winner, the
// loser and the metadata field the winner changes.
func sameEpochFork(t *testing.T, e *env) (h hosted, win, lose testpeer.Message, field string, stop func()) {
	t.Helper()
	h = e.register(peer(t, "bob").AccountID(), 1)
	_, stop = e.worker("w1", nil)
	alice, g := groupWithHosted(t, e, components.Set{}, h)
	e.waitEvents(h.rec.ClientID, 1)
	win, lose, field = publishFork(t, e, alice, g)
	return h, win, lose, field, stop
}

// publishFork publishes two competing commits from g's epoch: one renames
// the group, the other sets its description. It returns the winner, the
// loser and the metadata field the winner changes.
func publishFork(t *testing.T, e *env, alice *testpeer.Peer, g *testpeer.Group) (win, lose testpeer.Message, field string) {
	t.Helper()
	fork := must[[]testpeer.Message](t)(g.Branch(
		setProfile(components.ProfileState{Name: "x"}, alice.AccountID()),
		setProfile(components.ProfileState{Description: "d"}, alice.AccountID())))
	for _, m := range fork {
		e.publish(m)
	}
	win, lose = lower(fork[0], fork[1])
	field = components.FieldGroupName
	if bytes.Equal(win.ID, fork[1].ID) {
		field = components.FieldDescription
	}
	return win, lose, field
}

// wantFork checks the events of a same-epoch fork: joined, then the
// winner's metadata change only. A race branch selection resolves is no
// fork of the conversation: no conversation.fork_detected (FORK-040,
// docs/convergence.md "Fork state").
func wantFork(t *testing.T, evs []bus.Delivered, field string) {
	t.Helper()
	want := []schema.EventKind{schema.KindConversationJoined, schema.KindMetadataChanged}
	if !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}
	uniqueIDs(t, evs)
	if got := evs[1].Event.MetadataChanged.Changed; !slices.Equal(got, []string{field}) {
		t.Fatalf("metadata changed %v, want the winner's %s", got, field)
	}
}

// TestFORK040SameEpochRaceIsNoFork: two competing commits from one epoch
// end in the events of the selected branch only, with no
// conversation.fork_detected (branch selection resolves the race; the
// conversation's fork state never becomes forked, FORK-040), and outcome
// records for both commits: the selected one accepted, the other deferred
// on its losing branch (DESIGN section 5).
func TestFORK040SameEpochRaceIsNoFork(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, win, lose, field, _ := sameEpochFork(t, e)
	evs := e.waitEvents(h.rec.ClientID, 2)
	wantFork(t, evs, field)
	settled(t, e, win.Transport.Group, h.rec.ClientID, 2)
	if o := e.waitOutcome(win.ID, schema.DispositionAccepted); o.Status != schema.StatusQueued {
		t.Fatalf("winner %+v", o)
	}
	e.waitOutcome(lose.ID, schema.DispositionDeferred)
}

// settled waits until the group is quiet and checks that the client's
// events stay at n.
func settled(t *testing.T, e *env, group []byte, client string, n int) []bus.Delivered {
	t.Helper()
	e.quiet(group)
	return e.waitEvents(client, n)
}

// waitOutcome waits until an input's outcome record has disposition d.
func (e *env) waitOutcome(id []byte, d schema.Disposition) schema.Outcome {
	e.t.Helper()
	var o schema.Outcome
	eventually.NoError(e.t, func() error {
		if o = e.outcome(id); o.Disposition != d {
			return fmt.Errorf("outcome %s/%s, want %s", o.Status, o.Disposition, d)
		}
		return nil
	})
	return o
}

// TestLateWinnerRollsBackDeliveredBranch: a branch that was applied and
// whose app message was delivered loses to a deeper branch from the same
// parent that arrives later, inside the rollback horizon. The client gets
// fabric.commit_superseded for the applied commit, fabric.message_invalidated
// for the delivered message and the winning branch's events; a worker that
// re-reads the whole input stream emits none of them again.
func TestLateWinnerRollsBackDeliveredBranch(t *testing.T) {
	t.Parallel()
	e, client, stop, alice, g := bobJoined(t)
	other := must[*testpeer.Group](t)(g.Clone())

	cA := must[testpeer.Message](t)(g.Commit())
	e.publish(cA)
	e.waitOutcome(cA.ID, schema.DispositionAccepted)
	mA := must[testpeer.Message](t)(g.SendText("on the branch that loses"))
	e.publish(mA)
	e.waitEvents(client, 2)

	cB1 := must[testpeer.Message](t)(setProfile(components.ProfileState{Name: "b"}, alice.AccountID())(other))
	cB2 := must[testpeer.Message](t)(other.Commit())
	e.publish(cB1)
	e.publish(cB2)
	evs := e.waitEvents(client, 5)
	want := []schema.EventKind{
		schema.KindConversationJoined, schema.KindMessageReceived,
		schema.KindCommitSuperseded, schema.KindMessageInvalidated, schema.KindMetadataChanged,
	}
	if !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}
	if got := evs[2].Event.CommitSuperseded; !bytes.Equal(got.CommitDigest, cA.ID) || len(got.WithdrawnEventIDs) != 0 {
		t.Fatalf("commit_superseded %+v, want cA with no events of its own", got)
	}
	if got := evs[3].Event.MessageInvalidated.MessageID; !bytes.Equal(got, mA.ID) {
		t.Fatal("message_invalidated names another message")
	}
	if got := evs[4].Event.MetadataChanged.Changed; !slices.Equal(got, []string{components.FieldGroupName}) {
		t.Fatalf("metadata changed %v", got)
	}
	e.waitOutcome(cB1.ID, schema.DispositionAccepted)
	e.waitOutcome(cB2.ID, schema.DispositionAccepted)
	e.waitOutcome(cA.ID, schema.DispositionDeferred)
	e.waitOutcome(mA.ID, schema.DispositionInvalidated)
	stop()

	rewind(t, e)
	e.worker("w2", nil)
	uniqueIDs(t, settled(t, e, g.ID(), client, 5))
}

// rewind deletes every partition consumer, as if no input was acked.
func rewind(t *testing.T, e *env) {
	t.Helper()
	s, err := e.js.Stream(e.ctx, streams.StreamInput)
	if err != nil {
		t.Fatal(err)
	}
	for p := range subject.Partitions {
		_ = s.DeleteConsumer(e.ctx, ConsumerName(p))
	}
}

// TestCrashBetweenCutoffAndApply: a worker that stops after a pass's
// cutoff is persisted and before it is applied leaves the frozen batch in
// the group state; the next worker applies that batch and ends in the same
// selection, with no event twice.
func TestCrashBetweenCutoffAndApply(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	held := make(chan struct{}, 1)
	e.hooks.holdFrozen = func() bool {
		select {
		case held <- struct{}{}:
		default:
		}
		return true
	}
	h, win, lose, field, stop := sameEpochFork(t, e)
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("no pass was cut off")
	}
	stop()
	e.hooks.holdFrozen = nil
	if !frozenPass(t, e, win.Transport.Group) {
		t.Fatal("the checkpointed group state holds no frozen pass")
	}
	if evs := e.events(h.rec.ClientID); len(evs) != 1 {
		t.Fatalf("events before the apply %v", kinds(evs))
	}

	e.worker("w2", nil)
	evs := e.waitEvents(h.rec.ClientID, 2)
	wantFork(t, evs, field)
	settled(t, e, win.Transport.Group, h.rec.ClientID, 2)
	e.waitOutcome(win.ID, schema.DispositionAccepted)
	e.waitOutcome(lose.ID, schema.DispositionDeferred)
}

// viewBlob reads the blob of the group's one view as the group's
// checkpoint names it, with a worker that reads and writes blobs.
func viewBlob(t *testing.T, e *env, groupID []byte) (*Worker, checkpoint, []byte) {
	t.Helper()
	ck, _, err := readCheckpoint(e.ctx, e.js, tenant, hex.EncodeToString(groupID))
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(e.ctx, Config{JS: e.js, MLS: EngineMLS{Vault: e.vault}, WorkerID: "reader", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	blob, err := w.getBlob(e.ctx, ck.Members[sharedKey])
	if err != nil {
		t.Fatal(err)
	}
	return w, ck, blob
}

// frozenPass reports whether the group's checkpointed convergence view
// holds a frozen pass.
func frozenPass(t *testing.T, e *env, groupID []byte) bool {
	t.Helper()
	w, ck, blob := viewBlob(t, e, groupID)
	chunks, err := w.loadChunks(e.ctx, ck.MemberChunks[sharedKey])
	if err != nil {
		t.Fatal(err)
	}
	st, err := w.restoreMember(e.ctx, Client{Tenant: tenant, ClientID: sharedKey}, blob, chunks)
	if err != nil {
		t.Fatal(err)
	}
	b, ok := st.(*branchState)
	if !ok {
		t.Fatal("the member blob holds no convergence state")
	}
	cg := b.cg
	_, frozen := cg.Frozen()
	return frozen
}

// TestBranchReappliedAfterRollback: a branch that loses and then wins
// again is applied again with new event ids: its events are not lost to
// deduplication of the first application's ids.
func TestBranchReappliedAfterRollback(t *testing.T) {
	t.Parallel()
	e, client, g, cA := rolledBack(t, rename(t, "a"))
	e.waitEvents(client, 4)
	e.publishCommits(g, 2)
	e.waitOutcome(cA.ID, schema.DispositionAccepted)
	evs := settled(t, e, g.ID(), client, 7)
	want := []schema.EventKind{
		schema.KindConversationJoined, schema.KindMetadataChanged,
		schema.KindCommitSuperseded, schema.KindMetadataChanged,
		schema.KindCommitSuperseded, schema.KindCommitSuperseded, schema.KindMetadataChanged,
	}
	if !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}
	uniqueIDs(t, evs)
	if !bytes.Equal(evs[2].Event.CommitSuperseded.CommitDigest, cA.ID) {
		t.Fatal("the first rollback does not supersede the first branch")
	}
}

// TestCommitBeyondAnchorIsStale: a commit whose source epoch is older than
// the retained anchor (tip − max_rewind_commits) is stale with the named
// outcome BeyondAnchor, and changes nothing the client sees.
func TestCommitBeyondAnchorIsStale(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	e.worker("w1", nil)
	_, g := groupWithHosted(t, e, components.Set{}, h)
	e.waitEvents(h.rec.ClientID, 1)
	old := must[*testpeer.Group](t)(g.Clone())
	last := e.publishCommits(g, 6)
	e.waitOutcome(last.ID, schema.DispositionAccepted)
	late := must[testpeer.Message](t)(old.Commit())
	e.publish(late)
	o := e.waitOutcome(late.ID, schema.DispositionStale)
	if o.NamedOutcome != schema.BeyondAnchor || o.Category != schema.CategoryStaleEpoch {
		t.Fatalf("late commit %+v, want stale stale_epoch BeyondAnchor", o)
	}
	settled(t, e, g.ID(), h.rec.ClientID, 1)
}

// A cleanup pass whose atomic batch is stored but whose ack is lost (the
// "publish batch … ack failed: nats: timeout" of a loaded server) has what
// follows its batch published all the same: its outcome records (and the
// group's entries, KeyPackages retired). The pass that settles a
// same-epoch race runs without input, so no redelivery publishes them
// again: the winner's outcome stayed deferred for good. The group goes on:
// a sealed message of the winner's epoch, through ingest, is delivered;
// no event is stored twice (EVENT-001).
func TestCleanupPassWithLostAckIsPublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	submit := e.startIngest()
	// Every cleanup transaction's ack is lost: the one that cuts the
	// pass off and the one that applies it.
	var lost atomic.Int32
	e.hooks.batchAck = func(txn string, err error) error {
		if err == nil && strings.HasPrefix(txn, cleanupTxn) {
			lost.Add(1)
			return fmt.Errorf("bus: publish batch: %w", nats.ErrTimeout)
		}
		return err
	}
	h := e.register(peer(t, "bob").AccountID(), 1)
	e.worker("w1", nil)
	alice, g := groupWithHosted(t, e, components.Set{}, h)
	e.waitEvents(h.rec.ClientID, 1)
	win, lose, field := publishFork(t, e, alice, g)
	wantFork(t, e.waitEvents(h.rec.ClientID, 2), field)
	e.waitOutcome(win.ID, schema.DispositionAccepted)
	e.waitOutcome(lose.ID, schema.DispositionDeferred)
	if lost.Load() == 0 {
		t.Fatal("no cleanup pass was stored")
	}

	// Alice goes on on the winner's epoch, sealed, through ingest.
	if err := g.Adopt(win); err != nil {
		t.Fatal(err)
	}
	g.SetSealed(true)
	m := must[testpeer.Message](t)(g.SendText("after the pass"))
	if r := submit(m.Transport); r.Status != schema.StatusQueued {
		t.Fatalf("ingest answers %+v for a message of the new epoch, want queued", r)
	}
	evs := e.waitEvents(h.rec.ClientID, 3)
	if r := evs[2].Event.MessageReceived; r == nil || !r.MessageID.Equal(m.ID) {
		t.Fatalf("third event %v, want alice's message", kinds(evs))
	}
	uniqueIDs(t, evs)
}

// TestPassHoldsInputStoredBeforeItsDeadlineBehindABacklog: a convergence
// pass is cut off at its deadline in stream time, not when the worker's
// clock passes it while inputs stored before the deadline still wait in
// the partition's backlog. Alice renames the group twice (epochs e+1 and
// e+2) and sends a message in e+1 between them; a fetch holds two inputs,
// so her message comes in the next one, and the worker's clock is past
// every deadline. The message, stored before the pass's deadline, is in
// the pass, and the client's events follow the order the changes were
// made (EVENT-012): first rename, message, second rename.
func TestPassHoldsInputStoredBeforeItsDeadlineBehindABacklog(t *testing.T) {
	t.Parallel()
	e, client, _, _, _ := renamesAroundMessage(t)
	e.hooks.fetchBatch = 2
	e.worker("w2", func(c *Config) { c.Now = func() time.Time { return time.Now().Add(time.Minute) } })
	wantRenameMessageRename(t, e, client)
}

// renamesAroundMessage stops bob's worker and publishes, in this order,
// alice's rename of the group (epoch e+1), her second rename (e+2) and
// the message she sent in e+1 between them, all before any deadline.
func renamesAroundMessage(t *testing.T) (e *env, client string, first, hi, second testpeer.Message) {
	t.Helper()
	e, client, stop, alice, g := bobJoined(t)
	stop()
	rename := func(name string) testpeer.Message {
		return must[testpeer.Message](t)(setProfile(components.ProfileState{Name: name}, alice.AccountID())(g))
	}
	first = rename("first")
	hi = must[testpeer.Message](t)(g.SendText("hi"))
	second = rename("second")
	for _, m := range []testpeer.Message{first, second, hi} {
		e.publish(m)
	}
	return e, client, first, hi, second
}

// wantRenameMessageRename waits for bob's events after his join and
// checks they follow the order the changes were made (EVENT-012): the
// message between the renames.
func wantRenameMessageRename(t *testing.T, e *env, client string) {
	t.Helper()
	got := kinds(e.waitEvents(client, 4))
	want := []schema.EventKind{schema.KindConversationJoined, schema.KindMetadataChanged, schema.KindMessageReceived, schema.KindMetadataChanged}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}
