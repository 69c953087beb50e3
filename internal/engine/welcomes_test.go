package engine

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/thomas-vilte/mls-go/group"
	"github.com/thomas-vilte/mls-go/keypackages"
	"github.com/thomas-vilte/mls-go/treesync"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
)

// TestWelcomeCacheJoinsAsFullJoin: every hosted member a Welcome adds and
// that joins through the WelcomeCache (the first in full, the others from
// what it reached) holds the state a full join gives it, byte for byte:
// its own leaf, leaf key and path keys included. The group already has
// members, so the committer's path reaches the joiners and path keys are
// derived.
func TestWelcomeCacheJoinsAsFullJoin(t *testing.T) {
	alice := must[*testpeer.Peer](t)(testpeer.New("alice"))
	ag := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}}))
	var remote []*testpeer.Peer
	for _, name := range []string{"bob", "carol", "dave"} {
		remote = append(remote, must[*testpeer.Peer](t)(testpeer.New(name)))
	}
	if _, _, err := ag.Add(remote...); err != nil {
		t.Fatal(err)
	}
	insts, welcome := invitedInstallations(t, ag, 13)
	cache := NewWelcomeCache(0)
	withPathKeys := 0
	for i, inst := range insts {
		full, fullInfo, err := inst.Join(welcome.MLS, nil)
		if err != nil {
			t.Fatal(err)
		}
		cached, cachedInfo, err := inst.Join(welcome.MLS, nil, WithWelcomeCache(cache))
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && len(cache.entries) != 1 {
			t.Fatalf("the cache holds %d Welcomes, want 1", len(cache.entries))
		}
		a, b := must[[]byte](t)(full.Snapshot()), must[[]byte](t)(cached.Snapshot())
		if !bytes.Equal(a, b) {
			t.Fatalf("member %d: the state joined through the cache differs from a full join", i)
		}
		if fullInfo.Adder.InboxID != cachedInfo.Adder.InboxID || !bytes.Equal(fullInfo.KeyPackageRef, cachedInfo.KeyPackageRef) || fullInfo.Epoch != cachedInfo.Epoch {
			t.Fatalf("member %d: join info %+v, full join %+v", i, cachedInfo, fullInfo)
		}
		var sd group.StateData
		var env snapshotEnvelope
		if err := json.Unmarshal(b, &env); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(env.State, &sd); err != nil {
			t.Fatal(err)
		}
		if len(sd.PathNodePrivKeys) > 0 {
			withPathKeys++
		}
	}
	if withPathKeys == 0 {
		t.Fatal("no joiner got path keys: the test does not reach their derivation")
	}
	// Every member but the first finds the Welcome remembered, and the
	// state made from what the first reached is its full join's.
	w := must[*group.Welcome](t)(group.UnmarshalWelcome(welcome.MLS[4:]))
	for i, inst := range insts[1:] {
		ref := inst.KeyPackageRefs()[0]
		entry := inst.keyPackages[string(ref)]
		keys := must[*keypackages.KeyPackagePrivateKeys](t)(entry.privateKeys(inst.suite))
		secrets, ok := openSecrets(w, ref, keys)
		if !ok {
			t.Fatalf("member %d: its group secrets do not open", i+1)
		}
		e := cache.lookup(welcomeID(welcome.MLS), w.CipherSuite, secrets.JoinerSecret.AsSlice())
		if e == nil {
			t.Fatalf("member %d: the Welcome is not remembered", i+1)
		}
		g, _ := e.join(secrets, entry.kp, keys)
		if g == nil {
			t.Fatalf("member %d: no state from the remembered join", i+1)
		}
		full, _, err := inst.Join(welcome.MLS, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(must[[]byte](t)((&State{g: g}).Snapshot()), must[[]byte](t)(full.Snapshot())) {
			t.Fatalf("member %d: the remembered join differs from a full join", i+1)
		}
	}
}

// invitedInstallations makes n hosted installations of one KeyPackage each
// and the Welcome of g that adds them all.
func invitedInstallations(t testing.TB, g *testpeer.Group, n int) ([]*Installation, testpeer.Message) {
	t.Helper()
	insts := make([]*Installation, n)
	kps := make([][]byte, n)
	for i := range insts {
		insts[i] = must[*Installation](t)(CreateInstallation(newAccount(t), 0))
		kps[i] = must[[][]byte](t)(insts[i].NewKeyPackages(1))[0]
	}
	_, welcome, err := g.Invite(kps...)
	if err != nil {
		t.Fatal(err)
	}
	return insts, welcome
}

// subtreeHolds agrees with treesync's walk of the subtree.
func TestSubtreeHoldsAgreesWithTreesync(t *testing.T) {
	tree := treesync.NewRatchetTree(16)
	for n := range treesync.NodeIndex(len(tree.Nodes)) {
		for leaf := range uint32(16) {
			if got, want := subtreeHolds(n, leaf), tree.SubtreeContainsLeaf(n, treesync.LeafIndex(leaf)); got != want {
				t.Fatalf("node %d leaf %d: %v, treesync %v", n, leaf, got, want)
			}
		}
	}
}
