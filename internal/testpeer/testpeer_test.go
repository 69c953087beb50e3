package testpeer

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/binding"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func newPeer(t *testing.T, name string) *Peer {
	t.Helper()
	p, err := New(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// deliver has every group process m and returns what the last one made of it.
func deliver(t *testing.T, m Message, groups ...*Group) Received {
	t.Helper()
	var r Received
	for _, g := range groups {
		var err error
		if r, err = g.Process(m.Transport); err != nil {
			t.Fatalf("%s processing: %v", g.Peer().Name(), err)
		}
	}
	return r
}

func assertConverged(t *testing.T, groups ...*Group) {
	t.Helper()
	for _, g := range groups[1:] {
		if g.Epoch() != groups[0].Epoch() || !bytes.Equal(g.EpochAuthenticator(), groups[0].EpochAuthenticator()) {
			t.Fatalf("%s at epoch %d differs from %s at epoch %d",
				g.Peer().Name(), g.Epoch(), groups[0].Peer().Name(), groups[0].Epoch())
		}
	}
}

func wireFormat(mls []byte) uint16 { return binary.BigEndian.Uint16(mls[2:4]) }

// threeMembers returns a group of alice (admin), bob and carol at epoch 1.
func threeMembers(t *testing.T) (a, b, c *Group) {
	t.Helper()
	alice, bob, carol := newPeer(t, "alice"), newPeer(t, "bob"), newPeer(t, "carol")
	set := components.Set{
		Profile: &components.ProfileState{Name: "team"},
		Admins:  []components.AccountID{alice.AccountID()},
	}
	a = must[*Group](t)(alice.CreateGroup(set))
	commit, joined, err := a.Add(bob, carol)
	if err != nil {
		t.Fatal(err)
	}
	if wireFormat(commit.MLS) != 1 {
		t.Fatalf("commit wire format %d, want PublicMessage", wireFormat(commit.MLS))
	}
	b, c = joined[0], joined[1]
	if a.Epoch() != 1 {
		t.Fatalf("epoch %d after the founding add", a.Epoch())
	}
	assertConverged(t, a, b, c)
	return a, b, c
}

func TestIdentityAndKeyPackage(t *testing.T) {
	p := newPeer(t, "alice")
	sum := sha256.Sum256([]byte("alice"))
	if p.AccountID() != sum || p.InboxID() != components.AccountID(sum).InboxID() {
		t.Fatal("account id is not SHA-256 of the name")
	}
	if len(p.InstallationKey()) != 32 {
		t.Fatalf("installation key has %d bytes", len(p.InstallationKey()))
	}
	kp := must[[]byte](t)(p.KeyPackage())
	if binary.BigEndian.Uint16(kp[0:2]) != 1 || wireFormat(kp) != 5 {
		t.Fatal("key package is not an MLSMessage of wire format mls_key_package")
	}
	if binary.BigEndian.Uint16(kp[4:6]) != 1 || binary.BigEndian.Uint16(kp[6:8]) != uint16(CipherSuite) {
		t.Fatal("key package is not MLS 1.0 with cipher suite 0x0001")
	}
}

func TestInviteAndJoinFromWelcome(t *testing.T) {
	alice, bob := newPeer(t, "alice"), newPeer(t, "bob")
	a := must[*Group](t)(alice.CreateGroup(components.Set{}))
	commit, welcome, err := a.Invite(must[[]byte](t)(bob.KeyPackage()))
	if err != nil {
		t.Fatal(err)
	}
	if wireFormat(welcome.MLS) != 3 || welcome.Transport.Kind != schema.TransportMLS {
		t.Fatal("welcome is not an mls_welcome of kind mls")
	}
	if !bytes.Equal(welcome.Transport.Group, a.ID()) {
		t.Fatal("welcome's routing group is not the group id")
	}
	if sum := sha256.Sum256(commit.MLS); !bytes.Equal(commit.ID, sum[:]) || !bytes.Equal(commit.Transport.Payload, commit.MLS) {
		t.Fatal("message id is not SHA-256 of the MLS bytes")
	}
	// JoinFromWelcome takes no tree: the GroupInfo must carry it.
	b := must[*Group](t)(bob.Join(welcome.Transport))
	assertConverged(t, a, b)
	if len(b.Members()) != 2 || b.Members()[0].InboxID != alice.InboxID() {
		t.Fatalf("members = %+v", b.Members())
	}
	if _, err := bob.Join(welcome.Transport); !errors.Is(err, ErrNoKeyPackage) {
		t.Fatalf("second join with a used key package = %v", err)
	}
}

func TestAppPayloadsCarryReferences_EVENT021(t *testing.T) {
	a, b, c := threeMembers(t)

	hi := must[Message](t)(a.SendText("hi"))
	if wireFormat(hi.MLS) != 2 {
		t.Fatal("application message is not a PrivateMessage")
	}
	r := deliver(t, hi, b, c)
	if r.Kind != KindApplication || r.SenderInboxID != a.Peer().InboxID() || !bytes.Equal(r.ID, hi.ID) {
		t.Fatalf("received %+v", r)
	}
	if text, err := r.Payload.Text(); err != nil || text != "hi" {
		t.Fatalf("text = %q, %v", text, err)
	}

	reply := must[Message](t)(b.SendReply(hi.ID, "hey"))
	r = deliver(t, reply, a, c)
	if ref, kind, ok := r.Payload.References(); !ok || kind != apppayload.ReferenceReply || !bytes.Equal(ref, hi.ID) {
		t.Fatalf("reply references %x %v %v", ref, kind, ok)
	}

	reaction := must[Message](t)(c.SendReaction(hi.ID, "👍"))
	r = deliver(t, reaction, a, b)
	if ref, kind, ok := r.Payload.References(); !ok || kind != apppayload.ReferenceReaction || !bytes.Equal(ref, hi.ID) {
		t.Fatalf("reaction references %x %v %v", ref, kind, ok)
	}

	del := must[Message](t)(a.SendDelete(hi.ID))
	r = deliver(t, del, b, c)
	if target, ok := r.Payload.DeletionTarget(); !ok || !bytes.Equal(target, hi.ID) {
		t.Fatalf("deletion target %x %v", target, ok)
	}
	assertConverged(t, a, b, c)
}

func TestSetComponents(t *testing.T) {
	a, b, c := threeMembers(t)
	set := must[components.Set](t)(a.Components())
	set.Profile = &components.ProfileState{Name: "renamed", Description: "d"}
	set.Retention = &components.RetentionState{DisappearingSecs: 3600}
	commit := must[Message](t)(a.SetComponents(set))
	deliver(t, commit, b, c)
	assertConverged(t, a, b, c)
	for _, g := range []*Group{a, b, c} {
		got := must[components.Set](t)(g.Components())
		if got.Profile == nil || got.Profile.Name != "renamed" || got.Retention == nil || got.Retention.DisappearingSecs != 3600 {
			t.Fatalf("%s sees components %+v", g.Peer().Name(), got)
		}
		if len(got.Admins) != 1 || got.Admins[0] != a.Peer().AccountID() {
			t.Fatalf("%s lost the admin list", g.Peer().Name())
		}
	}
}

// A leave request is the leaver's Remove proposal of its own leaf, committed
// by another member (DESIGN section 2).
func TestLeaveIsCommittedByAnotherMember(t *testing.T) {
	a, b, c := threeMembers(t)
	leave := must[Message](t)(c.Leave())
	if wireFormat(leave.MLS) != 1 {
		t.Fatal("leave request is not a PublicMessage")
	}
	if r := deliver(t, leave, a, b); r.Kind != KindProposal || r.SenderInboxID != c.Peer().InboxID() {
		t.Fatalf("received %+v", r)
	}
	if _, err := c.SendText("still here?"); err == nil {
		t.Fatal("a leaver with a pending leave request could send")
	}
	commit := must[Message](t)(b.Commit())
	deliver(t, commit, a, c)
	if !c.Removed() || a.Removed() || b.Removed() {
		t.Fatalf("removed: a=%v b=%v c=%v", a.Removed(), b.Removed(), c.Removed())
	}
	assertConverged(t, a, b)
	if len(a.Members()) != 2 {
		t.Fatalf("members after leave: %+v", a.Members())
	}
	if _, err := c.SendText("x"); !errors.Is(err, ErrRemoved) {
		t.Fatalf("removed member sent: %v", err)
	}
}

func TestRemove(t *testing.T) {
	a, b, c := threeMembers(t)
	commit := must[Message](t)(a.Remove(b.Peer().InboxID()))
	deliver(t, commit, b, c)
	if !b.Removed() || c.Removed() {
		t.Fatal("wrong member removed")
	}
	assertConverged(t, a, c)
	msg := must[Message](t)(c.SendText("after"))
	if r := deliver(t, msg, a); r.SenderInboxID != c.Peer().InboxID() {
		t.Fatalf("received %+v", r)
	}
}

// Every member may be handed every message; its own are skipped.
func TestOwnOutputIsSkipped(t *testing.T) {
	a, b, _ := threeMembers(t)
	m := must[Message](t)(a.SendText("x"))
	if r := deliver(t, m, a); r.Kind != KindOwn {
		t.Fatalf("own message processed as %v", r.Kind)
	}
	commit := must[Message](t)(a.Commit())
	deliver(t, commit, a, b)
	assertConverged(t, a, b)
}

func TestForkProducesCompetingCommits(t *testing.T) {
	a, b, c := threeMembers(t)
	parentEpoch := a.Epoch()
	bOther := must[*Group](t)(b.Clone())
	commits := must[[]Message](t)(a.Fork(3))
	if len(commits) != 3 || a.Epoch() != parentEpoch {
		t.Fatalf("fork left the member at epoch %d", a.Epoch())
	}
	seen := map[string]bool{}
	for _, m := range commits {
		if m.Epoch != parentEpoch {
			t.Fatalf("fork commit from epoch %d", m.Epoch)
		}
		seen[string(m.ID)] = true
	}
	if len(seen) != 3 {
		t.Fatal("fork commits are not distinct")
	}

	deliver(t, commits[1], b, c)
	if err := a.Adopt(commits[1]); err != nil {
		t.Fatal(err)
	}
	assertConverged(t, a, b, c)

	// A copy of bob follows another branch and ends in a different state.
	deliver(t, commits[2], bOther)
	if bOther.Epoch() != b.Epoch() || bytes.Equal(bOther.EpochAuthenticator(), b.EpochAuthenticator()) {
		t.Fatal("competing branches reached the same state")
	}
	// The losing commits are alice's own output.
	if r := deliver(t, commits[0], a); r.Kind != KindOwn {
		t.Fatalf("losing own commit processed as %v", r.Kind)
	}
	if err := a.Adopt(commits[0]); !errors.Is(err, ErrUnknownBranch) {
		t.Fatalf("adopting after a branch was chosen = %v", err)
	}
}

func TestBranchWithDifferentChanges(t *testing.T) {
	a, b, c := threeMembers(t)
	msgs := must[[]Message](t)(a.Branch(
		func(g *Group) (Message, error) { return g.Remove(c.Peer().InboxID()) },
		func(g *Group) (Message, error) {
			set := must[components.Set](t)(g.Components())
			set.Profile = &components.ProfileState{Name: "other"}
			return g.SetComponents(set)
		},
	))
	deliver(t, msgs[1], b, c)
	if err := a.Adopt(msgs[1]); err != nil {
		t.Fatal(err)
	}
	assertConverged(t, a, b, c)
	if len(a.Members()) != 3 {
		t.Fatal("the removal branch leaked into the adopted one")
	}
}

// Sealed messages use the group event key of the epoch they were sent in;
// a member peels an older epoch's message with its retained keys.
func TestSealedTransport(t *testing.T) {
	a, b, c := threeMembers(t)
	a.SetSealed(true)
	old := must[Message](t)(a.SendText("sealed"))
	if old.Transport.Kind != schema.TransportSealed || bytes.Equal(old.Transport.Payload, old.MLS) {
		t.Fatal("message is not sealed")
	}
	if got, err := binding.Peel(old.Transport, [][binding.KeySize]byte{b.EventKey()}); err != nil || !bytes.Equal(got, old.MLS) {
		t.Fatalf("peel with the epoch key: %v", err)
	}
	commit := must[Message](t)(a.Commit())
	if commit.Transport.Kind != schema.TransportSealed {
		t.Fatal("commit is not sealed")
	}
	// Sealed under the parent epoch's key, which b and c hold.
	if _, err := binding.Peel(commit.Transport, [][binding.KeySize]byte{a.EventKey()}); !errors.Is(err, binding.ErrTransportDeferred) {
		t.Fatalf("commit opened with the new epoch's key: %v", err)
	}
	deliver(t, commit, b, c)
	assertConverged(t, a, b, c)
	// c has moved on; the epoch-1 message still peels and decrypts.
	r := deliver(t, old, c)
	if text, _ := r.Payload.Text(); text != "sealed" || r.Epoch != 1 {
		t.Fatalf("received %+v", r)
	}
	// An outsider's keys do not open it.
	d := must[*Group](t)(newPeer(t, "dave").CreateGroup(components.Set{}))
	if _, err := d.Process(old.Transport); !errors.Is(err, binding.ErrTransportDeferred) {
		t.Fatalf("outsider processing = %v", err)
	}
}

// Two installations of one account are two leaves with one inbox id.
func TestInstallationsOfOneAccount(t *testing.T) {
	a, b, _ := threeMembers(t)
	phone := must[*Peer](t)(b.Peer().NewInstallation("bob-phone"))
	if phone.InboxID() != b.Peer().InboxID() || phone.ClientID() == b.Peer().ClientID() {
		t.Fatal("installation does not share the account or shares the key")
	}
	commit, _, err := a.Add(phone)
	if err != nil {
		t.Fatal(err)
	}
	deliver(t, commit, b)
	n := 0
	for _, m := range a.Members() {
		if m.InboxID == b.Peer().InboxID() {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d leaves of bob's account", n)
	}
}

func TestProcessRejectsGarbage(t *testing.T) {
	a, _, _ := threeMembers(t)
	for name, tm := range map[string]schema.TransportMessage{
		"not mls":   {V: 1, Kind: schema.TransportMLS, Payload: []byte{0, 1, 0, 1, 2}},
		"bad kind":  {V: 1, Kind: "x", Payload: []byte{1}},
		"undecided": {V: 1, Kind: schema.TransportSealed, Payload: make([]byte, 64)},
	} {
		if _, err := a.Process(tm); err == nil {
			t.Errorf("%s: processed", name)
		}
	}
}
