package converge

import (
	"bytes"
	"slices"
	"testing"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventbus"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// rolledBack hosts bob in alice's group, applies change (alice's commit
// on the branch that will lose), then publishes a deeper branch of two
// empty commits from the same parent, which wins. It returns the env, the
// hosted client, alice's group on the losing branch and change's commit,
// once the commit is deferred.
func rolledBack(t *testing.T, change func(alice *testpeer.Peer, g *testpeer.Group) testpeer.Message) (*env, string, *testpeer.Group, testpeer.Message) {
	t.Helper()
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	client := h.rec.ClientID
	e.worker("w1", nil)
	alice, g := groupWithHosted(t, e, components.Set{}, h)
	e.waitEvents(client, 1)
	other := must[*testpeer.Group](t)(g.Clone())
	cA := change(alice, g)
	e.publish(cA)
	e.waitOutcome(cA.ID, schema.DispositionAccepted)
	e.waitEvents(client, 2)
	for range 2 {
		e.publish(must[testpeer.Message](t)(other.Commit()))
	}
	e.waitOutcome(cA.ID, schema.DispositionDeferred)
	return e, client, g, cA
}

// rename is a change that renames the group.
func rename(t *testing.T, name string) func(*testpeer.Peer, *testpeer.Group) testpeer.Message {
	return func(alice *testpeer.Peer, g *testpeer.Group) testpeer.Message {
		return must[testpeer.Message](t)(setProfile(components.ProfileState{Name: name}, alice.AccountID())(g))
	}
}

// wantWithdrawn checks that a commit_superseded names the superseded
// commit and exactly the events it had caused.
func wantWithdrawn(t *testing.T, sup *schema.CommitSuperseded, commit testpeer.Message, caused ...eventbus.Delivered) {
	t.Helper()
	var ids []string
	for _, d := range caused {
		ids = append(ids, d.ID)
	}
	if !bytes.Equal(sup.CommitDigest, commit.ID) || !slices.Equal(sup.WithdrawnEventIDs, ids) {
		t.Fatalf("commit_superseded %x withdraws %v, want %x withdrawing %v", []byte(sup.CommitDigest), sup.WithdrawnEventIDs, commit.ID, ids)
	}
}

// TestRollbackOfAddReportsTheMemberGone: a member added by a commit that a
// later winner supersedes is reported removed: after the rollback,
// membership is measured against the winning branch (the winner's own
// commits add no one), and fabric.commit_superseded names the commit and
// the membership_changed it withdraws.
func TestRollbackOfAddReportsTheMemberGone(t *testing.T) {
	carol := peer(t, "carol")
	e, client, _, cA := rolledBack(t, func(_ *testpeer.Peer, g *testpeer.Group) testpeer.Message {
		add, _, err := g.Add(carol)
		if err != nil {
			t.Fatal(err)
		}
		return add
	})
	evs := settled(t, e, client, 4)
	uniqueIDs(t, evs)
	want := []schema.EventKind{schema.KindConversationJoined, schema.KindMembershipChanged, schema.KindCommitSuperseded, schema.KindMembershipChanged}
	if !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}
	if got := evs[1].Event.MembershipChanged; !slices.Equal(got.AddedInboxIDs, []string{carol.InboxID()}) || len(got.RemovedInboxIDs) != 0 {
		t.Fatalf("the add reported %+v", got)
	}
	wantWithdrawn(t, evs[2].Event.CommitSuperseded, cA, evs[1])
	if got := evs[3].Event.MembershipChanged; len(got.AddedInboxIDs) != 0 || !slices.Equal(got.RemovedInboxIDs, []string{carol.InboxID()}) {
		t.Fatalf("after the rollback %+v, want carol removed", got)
	}
}

// TestRollbackOfRenameReportsTheNameBack: a rename superseded by a later
// winner is reported undone (metadata_changed group_name, measured
// against the winning branch), and fabric.commit_superseded names the
// rename and the metadata_changed it withdraws.
func TestRollbackOfRenameReportsTheNameBack(t *testing.T) {
	e, client, _, cA := rolledBack(t, rename(t, "renamed"))
	evs := settled(t, e, client, 4)
	uniqueIDs(t, evs)
	want := []schema.EventKind{schema.KindConversationJoined, schema.KindMetadataChanged, schema.KindCommitSuperseded, schema.KindMetadataChanged}
	if !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}
	wantWithdrawn(t, evs[2].Event.CommitSuperseded, cA, evs[1])
	if got := evs[3].Event.MetadataChanged.Changed; !slices.Equal(got, []string{components.FieldGroupName}) {
		t.Fatalf("after the rollback %v changed, want the group name", got)
	}
}

// TestFORK040LostRetainedStateIsForked: a hosted member whose retained
// state inside the rollback horizon is lost can follow no branch
// (Unrecoverable, Marmot durability.md): its fork state becomes forked and
// its client gets conversation.fork_detected, once, however much input
// follows.
func TestFORK040LostRetainedStateIsForked(t *testing.T) {
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	client := h.rec.ClientID
	_, stop := e.worker("w1", nil)
	_, g := groupWithHosted(t, e, components.Set{}, h)
	e.waitEvents(client, 1)
	c := must[testpeer.Message](t)(g.Commit())
	e.publish(c)
	e.waitOutcome(c.ID, schema.DispositionAccepted)
	stop()
	loseRetainedState(t, e, c.Transport.Group, client)

	e.worker("w2", nil)
	for _, text := range []string{"one", "two"} {
		e.publish(must[testpeer.Message](t)(g.SendText(text)))
	}
	evs := settled(t, e, client, 2)
	if want := []schema.EventKind{schema.KindConversationJoined, schema.KindConversationForkDetected}; !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}
}

// loseRetainedState damages the snapshot of the member's oldest retained
// state (the anchor, below its canonical tip) in its stored convergence
// state, as storage loss would: the state no longer restores.
func loseRetainedState(t *testing.T, e *env, groupID []byte, client string) {
	t.Helper()
	w, ck, blob := memberBlob(t, e, groupID, client)
	key := ck.Members[client]
	sealed, ok := bytes.CutPrefix(blob, splitPrefix)
	if !ok {
		t.Fatal("the member blob is not a split convergence state")
	}
	raw, err := e.vault.OpenState(sealed)
	if err != nil {
		t.Fatal(err)
	}
	// The ratchet tree's declared leaf count (its first base64 digit)
	// becomes absurd; the anchor's snapshot comes first (by epoch).
	at := bytes.Index(raw, []byte(`"ratchet_tree":"A`))
	if at < 0 || bytes.Count(raw, []byte(`"ratchet_tree":"`)) < 2 {
		t.Fatal("no retained state below the tip in the stored state")
	}
	raw[at+len(`"ratchet_tree":"`)] = '/'
	resealed, err := e.vault.SealState(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.putBlobs(e.ctx, map[string][]byte{key: append(slices.Clone(splitPrefix), resealed...)}); err != nil {
		t.Fatal(err)
	}
}
