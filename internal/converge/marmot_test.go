package converge

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventbus"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func branchSelection(c *Config) { c.BranchSelection = true }

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
	_, stop = e.worker("w1", branchSelection)
	alice, g := groupWithHosted(t, e, components.Set{}, h)
	e.waitEvents(h.rec.ClientID, 1)
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
	return h, win, lose, field, stop
}

// wantFork checks the events of a same-epoch fork: joined, fork_detected,
// then the winner's metadata change only.
func wantFork(t *testing.T, evs []eventbus.Delivered, field string) {
	t.Helper()
	want := []schema.EventKind{schema.KindConversationJoined, schema.KindConversationForkDetected, schema.KindMetadataChanged}
	if !slices.Equal(kinds(evs), want) {
		t.Fatalf("events %v, want %v", kinds(evs), want)
	}
	uniqueIDs(t, evs)
	if got := evs[2].Event.MetadataChanged.Changed; !slices.Equal(got, []string{field}) {
		t.Fatalf("metadata changed %v, want the winner's %s", got, field)
	}
}

// TestSameEpochForkSelectsOneBranch: two competing commits from one epoch
// end in conversation.fork_detected, the events of the selected branch
// only, and outcome records for both commits: the selected one accepted,
// the other deferred on its losing branch (DESIGN section 5).
func TestSameEpochForkSelectsOneBranch(t *testing.T) {
	e := newEnv(t)
	h, win, lose, field, _ := sameEpochFork(t, e)
	evs := e.waitEvents(h.rec.ClientID, 3)
	wantFork(t, evs, field)
	settled(t, e, h.rec.ClientID, 3)
	if o := e.waitOutcome(win.ID, schema.DispositionAccepted); o.Status != schema.StatusQueued {
		t.Fatalf("winner %+v", o)
	}
	e.waitOutcome(lose.ID, schema.DispositionDeferred)
}

// settled checks that a client's events stay at n.
func settled(t *testing.T, e *env, client string, n int) []eventbus.Delivered {
	t.Helper()
	time.Sleep(1500 * time.Millisecond)
	return e.waitEvents(client, n)
}

// waitOutcome waits until an input's outcome record has disposition d.
func (e *env) waitOutcome(id []byte, d schema.Disposition) schema.Outcome {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		o := e.outcome(id)
		if o.Disposition == d {
			return o
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("outcome %s/%s, want %s", o.Status, o.Disposition, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
