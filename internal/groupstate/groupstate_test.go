package groupstate

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// world is a group of mls-go peers (internal/testpeer: alice, the admin,
// and bob) and hosted members held once in a Group. Beside the Group every
// hosted member also has its own standalone engine.State (solo), processed
// as a member on its own would be: the Group must reach exactly the keys,
// epochs and plaintexts the standalone members reach.
type world struct {
	t      testing.TB
	alice  *testpeer.Group
	bob    *testpeer.Group
	g      *Group
	insts  map[string]*engine.Installation
	solo   map[string]*engine.State
	wc     *engine.WelcomeCache
	solos  bool // keep and check the standalone members
	hosted []string
}

func newWorld(t testing.TB, hosted int, cfg Config, solos bool) *world {
	t.Helper()
	alice, err := testpeer.New("alice")
	if err != nil {
		t.Fatal(err)
	}
	bob, err := testpeer.New("bob")
	if err != nil {
		t.Fatal(err)
	}
	ag, err := alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}})
	if err != nil {
		t.Fatal(err)
	}
	_, joined, err := ag.Add(bob)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, alice: ag, bob: joined[0], g: New(cfg), insts: map[string]*engine.Installation{},
		solo: map[string]*engine.State{}, wc: engine.NewWelcomeCache(0), solos: solos}
	if hosted > 0 {
		w.invite(hosted)
	}
	return w
}

// invite has alice add n new hosted members in one commit; they join.
func (w *world) invite(n int) []string {
	w.t.Helper()
	var kps [][]byte
	var insts []*engine.Installation
	for range n {
		account := make([]byte, engine.AccountIDLen)
		if _, err := rand.Read(account); err != nil {
			w.t.Fatal(err)
		}
		inst, err := engine.CreateInstallation(account, 0)
		if err != nil {
			w.t.Fatal(err)
		}
		kp, err := inst.NewKeyPackages(1)
		if err != nil {
			w.t.Fatal(err)
		}
		kps = append(kps, kp[0])
		insts = append(insts, inst)
	}
	commit, welcome, err := w.alice.Invite(kps...)
	if err != nil {
		w.t.Fatal(err)
	}
	w.peersProcess(commit.Transport, w.alice)
	if len(w.hosted) > 0 {
		w.hostedProcess(commit.MLS, "")
	}
	pw, err := engine.ParseWelcome(welcome.MLS)
	if err != nil {
		w.t.Fatal(err)
	}
	var ids []string
	for _, inst := range insts {
		id := inst.ClientID()
		if w.solos {
			st, _, err := inst.Join(welcome.MLS, nil)
			if err != nil {
				w.t.Fatalf("join: %v", err)
			}
			w.solo[id] = st
		}
		if _, err := w.g.JoinWelcome(inst, welcome.MLS, pw, w.wc); err != nil {
			w.t.Fatalf("group join: %v", err)
		}
		w.insts[id] = inst
		w.hosted = append(w.hosted, id)
		ids = append(ids, id)
	}
	w.check()
	return ids
}

// peersProcess has the mls-go peers but from process a message.
func (w *world) peersProcess(m schema.TransportMessage, from *testpeer.Group) []testpeer.Received {
	w.t.Helper()
	var out []testpeer.Received
	for _, p := range []*testpeer.Group{w.alice, w.bob} {
		if p == from || p.Removed() {
			continue
		}
		r, err := p.Process(m)
		if err != nil {
			w.t.Fatalf("peer process: %v", err)
		}
		out = append(out, r)
	}
	return out
}

// hostedProcess applies a handshake message to the Group and to every
// standalone member but the committer (whose own commit its state made).
func (w *world) hostedProcess(msg []byte, committer string) *Outcome {
	w.t.Helper()
	out, err := w.g.ProcessHandshake(msg)
	if err != nil {
		w.t.Fatalf("group process: %v", err)
	}
	if w.solos {
		for id, st := range w.solo {
			if id == committer {
				continue
			}
			next, res, err := st.ProcessHandshake(msg)
			if err != nil {
				w.t.Fatalf("standalone process: %v", err)
			}
			if res.RemovedSelf {
				delete(w.solo, id)
				continue
			}
			w.solo[id] = next
		}
	}
	for _, id := range out.Removed {
		w.hosted = slices.DeleteFunc(w.hosted, func(h string) bool { return h == id })
	}
	return out
}

// remoteCommit has a peer's commit processed by the other peer and by the
// hosted members.
func (w *world) remoteCommit(from *testpeer.Group, produce func() (testpeer.Message, error)) *Outcome {
	w.t.Helper()
	m, err := produce()
	if err != nil {
		w.t.Fatal(err)
	}
	w.peersProcess(m.Transport, from)
	out := w.hostedProcess(m.MLS, "")
	w.check()
	return out
}

// hostedCommit has hosted member id commit req through the Group.
func (w *world) hostedCommit(id string, req engine.CommitRequest) *Outcome {
	w.t.Helper()
	out, err := w.g.Commit(id, w.insts[id], req)
	if err != nil {
		w.t.Fatalf("hosted commit: %v", err)
	}
	w.peersProcess(transport(w.alice.ID(), out.Commit), nil)
	res := w.hostedProcess(out.Commit, id)
	if w.solos {
		// A member's own commit: its standalone state is the one the
		// Group's commit made; later commits by others check its keys.
		st, err := w.g.StateOf(id)
		if err != nil {
			w.t.Fatal(err)
		}
		w.solo[id] = st
	}
	w.check()
	return res
}

func transport(group, mls []byte) schema.TransportMessage {
	return schema.TransportMessage{V: schema.TransportVersion, Group: group, Kind: schema.TransportMLS, Payload: mls}
}

// check compares every hosted member with the peers and its standalone
// state: same epoch and epoch authenticator (so same tree, context and
// key schedule), same private keys.
func (w *world) check() {
	w.t.Helper()
	if got := w.g.Members(); !slices.Equal(got, sorted(w.hosted)) {
		w.t.Fatalf("hosted members %d, want %d", len(got), len(w.hosted))
	}
	if len(w.hosted) == 0 {
		return
	}
	if e := w.g.Epoch(); e != w.alice.Epoch() {
		w.t.Fatalf("group epoch %d, peers' %d", e, w.alice.Epoch())
	}
	if !bytes.Equal(w.g.Shared().EpochAuthenticator(), w.alice.EpochAuthenticator()) {
		w.t.Fatal("shared epoch authenticator differs from the peers'")
	}
	if !w.solos {
		return
	}
	for _, id := range w.hosted {
		solo, err := w.solo[id].MemberKeys()
		if err != nil {
			w.t.Fatal(err)
		}
		shared, _ := w.g.Keys(id)
		if !shared.Equal(solo) {
			w.t.Fatalf("member at leaf %d: shared keys (%d path) differ from its standalone keys (%d path)", solo.Leaf, len(shared.Path), len(solo.Path))
		}
	}
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

func textOf(t testing.TB, payload []byte) string {
	t.Helper()
	p, err := apppayload.Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.Text()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func encodeText(t testing.TB, s string) []byte {
	t.Helper()
	b, err := apppayload.Encode(apppayload.NewText(s))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSharedCommitMatchesStandaloneMembers: through self-updates by a
// peer, adds, removals and hosted members' own commits, every hosted
// member's keys held in the Group equal what its standalone state
// reaches, and the epoch authenticator is the peers'.
func TestSharedCommitMatchesStandaloneMembers(t *testing.T) {
	w := newWorld(t, 6, Config{}, true)
	w.remoteCommit(w.bob, w.bob.Commit)
	more := w.invite(5)
	w.remoteCommit(w.alice, w.alice.Commit)
	w.hostedCommit(w.hosted[2], engine.CommitRequest{})
	w.remoteCommit(w.bob, w.bob.Commit)
	// Remove two hosted members, one of them perhaps the carrier.
	gone := []uint32{}
	for _, id := range []string{w.hosted[0], more[1]} {
		k, _ := w.g.Keys(id)
		gone = append(gone, k.Leaf)
	}
	out := w.remoteCommit(w.alice, func() (testpeer.Message, error) { return w.alice.RemoveLeaves(gone...) })
	if len(out.Removed) != 2 {
		t.Fatalf("removed %d hosted members, want 2", len(out.Removed))
	}
	w.hostedCommit(w.hosted[len(w.hosted)-1], engine.CommitRequest{})
	w.invite(3)
	w.remoteCommit(w.bob, w.bob.Commit)
	w.hostedCommit(w.hosted[0], engine.CommitRequest{})
	w.remoteCommit(w.alice, w.alice.Commit)
}

// TestSharedCarrierRemoved: a commit that removes the member the shared
// state was processed as is processed as another hosted member.
func TestSharedCarrierRemoved(t *testing.T) {
	w := newWorld(t, 4, Config{}, true)
	w.remoteCommit(w.bob, w.bob.Commit)
	carrier := w.g.carrier
	k, _ := w.g.Keys(carrier)
	out := w.remoteCommit(w.alice, func() (testpeer.Message, error) { return w.alice.RemoveLeaves(k.Leaf) })
	if !slices.Equal(out.Removed, []string{carrier}) || w.g.carrier == carrier {
		t.Fatalf("removed %v, carrier still the removed member: %v", out.Removed, w.g.carrier == carrier)
	}
	w.remoteCommit(w.bob, w.bob.Commit)
}

// TestSharedAllRemoved: a commit that removes every hosted member ends
// the group's hosted state.
func TestSharedAllRemoved(t *testing.T) {
	w := newWorld(t, 2, Config{}, true)
	var leaves []uint32
	for _, id := range w.hosted {
		k, _ := w.g.Keys(id)
		leaves = append(leaves, k.Leaf)
	}
	out := w.remoteCommit(w.alice, func() (testpeer.Message, error) { return w.alice.RemoveLeaves(leaves...) })
	if len(out.Removed) != 2 || len(w.g.Members()) != 0 {
		t.Fatalf("removed %v, left %v", out.Removed, w.g.Members())
	}
	if _, err := w.g.ProcessHandshake([]byte{0}); !errors.Is(err, ErrEnded) {
		t.Fatalf("process after the end: %v", err)
	}
}

// TestSharedMessagesFromPeer: a peer's application message is decrypted
// once and delivered to every hosted member, with the plaintext each
// standalone member decrypts.
func TestSharedMessagesFromPeer(t *testing.T) {
	w := newWorld(t, 5, Config{}, true)
	w.remoteCommit(w.bob, w.bob.Commit)
	m, err := w.bob.SendText("hello")
	if err != nil {
		t.Fatal(err)
	}
	w.peersProcess(m.Transport, w.bob)
	d, err := w.g.Decrypt(m.MLS)
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(t, d.App.Payload); got != "hello" || d.Echo != "" {
		t.Fatalf("delivery %q echo %q", got, d.Echo)
	}
	if !slices.Equal(d.Recipients(), sorted(w.hosted)) {
		t.Fatalf("recipients %d, want every hosted member (%d)", len(d.Recipients()), len(w.hosted))
	}
	for id, st := range w.solo {
		app, err := st.Decrypt(m.MLS)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(app.Payload, d.App.Payload) || app.Sender.Leaf != d.App.Sender.Leaf || app.Generation != d.App.Generation {
			t.Fatalf("member %s decrypts otherwise on its own", id)
		}
	}
	// RFC 9420 §9.2: a generation's key serves once.
	if _, err := w.g.Decrypt(m.MLS); err == nil {
		t.Fatal("the same message decrypted twice")
	}
}

// TestSharedMessagesFromHostedMember: a hosted member's message, encrypted
// on the shared secret tree, decrypts at the peers and at every
// standalone member; when it comes back it is delivered to the other
// hosted members and dropped for its sender (Echo).
func TestSharedMessagesFromHostedMember(t *testing.T) {
	w := newWorld(t, 4, Config{}, true)
	sender := w.hosted[1]
	var sent [][]byte
	for i := range 3 {
		msg, err := w.g.Encrypt(sender, w.insts[sender], encodeText(t, "from hosted "+string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		sent = append(sent, msg)
	}
	other := w.hosted[2]
	if _, err := w.g.Encrypt(other, w.insts[other], encodeText(t, "second sender")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.g.Encrypt(other, w.insts[sender], encodeText(t, "forged")); err == nil {
		t.Fatal("a member encrypted with another's installation")
	}
	for i, msg := range sent {
		want := "from hosted " + string(rune('a'+i))
		for _, r := range w.peersProcess(transport(w.alice.ID(), msg), nil) {
			if got, _ := r.Payload.Text(); got != want {
				t.Fatalf("peer got %q, want %q", got, want)
			}
		}
		d, err := w.g.Decrypt(msg)
		if err != nil {
			t.Fatal(err)
		}
		if d.Echo != sender || slices.Contains(d.Recipients(), sender) || len(d.Recipients()) != len(w.hosted)-1 {
			t.Fatalf("echo %v, recipients %d", d.Echo == sender, len(d.Recipients()))
		}
		if got := textOf(t, d.App.Payload); got != want {
			t.Fatalf("delivered %q", got)
		}
		for id, st := range w.solo {
			if id == sender {
				continue
			}
			app, err := st.Decrypt(msg)
			if err != nil || !bytes.Equal(app.Payload, d.App.Payload) {
				t.Fatalf("standalone member: %v", err)
			}
		}
	}
}

// TestSharedDeliveryRespectsJoinAndRemoval: a late message of a past epoch
// goes to the hosted members of that epoch: not to one who joined after
// it, and still to one removed since.
func TestSharedDeliveryRespectsJoinAndRemoval(t *testing.T) {
	w := newWorld(t, 3, Config{KeepEpochs: 2}, false)
	late, err := w.bob.SendText("sent before the changes")
	if err != nil {
		t.Fatal(err)
	}
	before := w.g.Members()
	joiner := w.invite(1)[0]
	k, _ := w.g.Keys(w.hosted[0])
	removed := w.hosted[0]
	w.remoteCommit(w.alice, func() (testpeer.Message, error) { return w.alice.RemoveLeaves(k.Leaf) })
	now, err := w.bob.SendText("sent after")
	if err != nil {
		t.Fatal(err)
	}
	d, err := w.g.Decrypt(late.MLS)
	if err != nil {
		t.Fatalf("late message of a kept epoch: %v", err)
	}
	if !slices.Equal(d.Recipients(), before) || slices.Contains(d.Recipients(), joiner) || !slices.Contains(d.Recipients(), removed) {
		t.Fatal("late message not delivered to its epoch's hosted members")
	}
	d, err = w.g.Decrypt(now.MLS)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(d.Recipients(), joiner) || slices.Contains(d.Recipients(), removed) {
		t.Fatal("current message not delivered to the current hosted members")
	}
}

// TestSharedForwardSecrecy: RFC 9420 §9.2. With no past epoch kept, a
// commit deletes the epoch it leaves: its messages no longer decrypt;
// with one kept, one commit later it is gone too. The path keys a commit
// replaced are in no hosted member's keys afterwards.
func TestSharedForwardSecrecy(t *testing.T) {
	for _, keep := range []int{0, 1} {
		w := newWorld(t, 4, Config{KeepEpochs: keep}, false)
		w.remoteCommit(w.bob, w.bob.Commit)
		old := map[string]bool{}
		for _, id := range w.hosted {
			k, _ := w.g.Keys(id)
			for _, v := range k.Path {
				old[string(v)] = true
			}
		}
		if len(old) == 0 {
			t.Fatal("no path keys to replace")
		}
		m, err := w.bob.SendText("old epoch")
		if err != nil {
			t.Fatal(err)
		}
		w.remoteCommit(w.bob, w.bob.Commit)
		for _, id := range w.hosted {
			k, _ := w.g.Keys(id)
			for n, v := range k.Path {
				if old[string(v)] {
					t.Fatalf("node %d keeps a path key the commit replaced", n)
				}
			}
		}
		_, err = w.g.Decrypt(m.MLS)
		if keep == 0 {
			var e *engine.Error
			if !errors.As(err, &e) || e.Category != schema.CategoryStaleEpoch {
				t.Fatalf("old epoch message after its epoch was deleted: %v", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("old epoch message within the kept window: %v", err)
		}
		m2, err := w.bob.SendText("old epoch again")
		if err != nil {
			t.Fatal(err)
		}
		_ = m2
		w.remoteCommit(w.alice, w.alice.Commit)
		w.remoteCommit(w.alice, w.alice.Commit)
		if _, err := w.g.Decrypt(m2.MLS); err == nil {
			t.Fatal("a message of an epoch past the kept window decrypted")
		}
	}
}

// TestSharedSnapshotRoundTrip: the snapshot holds the shared state once,
// with no member's private key in it, and each member's keys apart; the
// group restored from its one blob goes on exactly as the original.
func TestSharedSnapshotRoundTrip(t *testing.T) {
	w := newWorld(t, 5, Config{}, true)
	w.remoteCommit(w.bob, w.bob.Commit)
	w.hostedCommit(w.hosted[3], engine.CommitRequest{})
	// An own commit not yet come back is in the snapshot too.
	pendingID := w.hosted[1]
	pending, err := w.g.Commit(pendingID, w.insts[pendingID], engine.CommitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := w.g.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Members) != len(w.hosted) || len(snap.Pending) != 1 {
		t.Fatalf("snapshot has %d members, %d pending", len(snap.Members), len(snap.Pending))
	}
	for _, m := range snap.Members {
		secrets := [][]byte{m.Keys.LeafKey}
		for _, v := range m.Keys.Path {
			secrets = append(secrets, v)
		}
		for _, s := range secrets {
			if bytes.Contains(snap.Shared, []byte(base64.StdEncoding.EncodeToString(s))) {
				t.Fatal("the shared part holds a member's private key")
			}
		}
	}
	blob, err := snap.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := UnmarshalSnapshot(blob)
	if err != nil {
		t.Fatal(err)
	}
	g, err := Restore(back, Config{})
	if err != nil {
		t.Fatal(err)
	}
	w.g = g
	w.check()
	// The pending own commit comes back to the restored group.
	w.peersProcess(transport(w.alice.ID(), pending.Commit), nil)
	w.hostedProcess(pending.Commit, pendingID)
	st, err := w.g.StateOf(pendingID)
	if err != nil {
		t.Fatal(err)
	}
	w.solo[pendingID] = st
	w.check()
	w.remoteCommit(w.alice, w.alice.Commit)
	m, err := w.bob.SendText("after restore")
	if err != nil {
		t.Fatal(err)
	}
	d, err := w.g.Decrypt(m.MLS)
	if err != nil || textOf(t, d.App.Payload) != "after restore" {
		t.Fatalf("decrypt after restore: %v", err)
	}
	if _, err := UnmarshalSnapshot([]byte(`{"v":2}`)); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("other version: %v", err)
	}
	// Member parts that do not fit the shared part are refused.
	twice := *back
	twice.Members = append(slices.Clone(back.Members), MemberSnapshot{ID: "other", Keys: back.Members[0].Keys})
	if _, err := Restore(&twice, Config{}); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("two members on one leaf: %v", err)
	}
	blank := *back
	blank.Members = append(slices.Clone(back.Members), MemberSnapshot{ID: "other", Keys: &engine.MemberKeys{Leaf: 1 << 20}})
	if _, err := Restore(&blank, Config{}); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("a member on no leaf of the group: %v", err)
	}
}

// TestSharedJoinOtherEpoch: a joined state of another epoch is refused.
func TestSharedJoinOtherEpoch(t *testing.T) {
	w := newWorld(t, 2, Config{}, false)
	st, err := w.g.StateOf(w.hosted[0])
	if err != nil {
		t.Fatal(err)
	}
	w.remoteCommit(w.bob, w.bob.Commit)
	if err := w.g.Join("late", st); !errors.Is(err, ErrEpoch) {
		t.Fatalf("join at a past epoch: %v", err)
	}
}

// TestSharedConcurrentUse: hosted members encrypting and the group
// decrypting from several goroutines at once (the secret tree is not safe
// for concurrent use: the Group's lock serializes them; run with -race).
func TestSharedConcurrentUse(t *testing.T) {
	w := newWorld(t, 4, Config{}, false)
	var msgs [][]byte
	for range 8 {
		m, err := w.bob.SendText("concurrent")
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m.MLS)
	}
	errs := make(chan error, len(w.hosted)+len(msgs))
	var wg sync.WaitGroup
	for _, id := range w.hosted {
		payload := encodeText(t, "from "+id)
		wg.Go(func() {
			_, err := w.g.Encrypt(id, w.insts[id], payload)
			errs <- err
		})
	}
	for _, m := range msgs {
		wg.Go(func() {
			_, err := w.g.Decrypt(m)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestSharedOwnCommitWithoutItsState: a hosted member's commit made
// elsewhere (its state after it is not in this group) comes back: the
// others follow it, and the committer, whose new secrets are not here, is
// dropped as lost rather than kept with stale keys.
func TestSharedOwnCommitWithoutItsState(t *testing.T) {
	w := newWorld(t, 4, Config{}, true)
	committer := w.hosted[1]
	out, err := w.solo[committer].Commit(w.insts[committer], engine.CommitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	w.peersProcess(transport(w.alice.ID(), out.Commit), nil)
	res := w.hostedProcess(out.Commit, committer)
	if res.Lost != committer || slices.Contains(w.g.Members(), committer) {
		t.Fatalf("lost %q, members %v", res.Lost, w.g.Members())
	}
	delete(w.solo, committer)
	w.hosted = slices.DeleteFunc(w.hosted, func(id string) bool { return id == committer })
	w.check()
	w.remoteCommit(w.bob, w.bob.Commit)
}

// TestSharedOnlyMemberOwnCommitWithoutItsState: when the only hosted
// member's own commit comes back without its state, nobody here can
// follow it: the commit fails with missing_history, the group unchanged.
func TestSharedOnlyMemberOwnCommitWithoutItsState(t *testing.T) {
	w := newWorld(t, 1, Config{}, true)
	id := w.hosted[0]
	out, err := w.solo[id].Commit(w.insts[id], engine.CommitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	epoch := w.g.Epoch()
	_, err = w.g.ProcessHandshake(out.Commit)
	if !errors.Is(err, ErrNoFollower) || engine.CategoryOf(err) != schema.CategoryMissingHistory {
		t.Fatalf("process: %v", err)
	}
	if w.g.Epoch() != epoch || !slices.Equal(w.g.Members(), []string{id}) {
		t.Fatal("the group moved")
	}
}

// TestSharedJoinWelcomeOfAnotherEpoch: a Welcome whose commit the group
// has not processed is not of the held epoch: it is not remembered from
// the held state, and the full join it falls back to is refused as of
// another epoch. Once the commit is processed, the same Welcome joins.
func TestSharedJoinWelcomeOfAnotherEpoch(t *testing.T) {
	w := newWorld(t, 2, Config{}, true)
	account := make([]byte, engine.AccountIDLen)
	if _, err := rand.Read(account); err != nil {
		t.Fatal(err)
	}
	inst, err := engine.CreateInstallation(account, 0)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := inst.NewKeyPackages(1)
	if err != nil {
		t.Fatal(err)
	}
	commit, welcome, err := w.alice.Invite(kp[0])
	if err != nil {
		t.Fatal(err)
	}
	pw, err := engine.ParseWelcome(welcome.MLS)
	if err != nil {
		t.Fatal(err)
	}
	cache := engine.NewWelcomeCache(0)
	if ok, err := w.g.Shared().RememberWelcome(inst, pw, cache); ok || err != nil {
		t.Fatalf("a Welcome of the next epoch remembered from the held one: %v, %v", ok, err)
	}
	if _, err := w.g.JoinWelcome(inst, welcome.MLS, pw, cache); !errors.Is(err, ErrEpoch) {
		t.Fatalf("join before the commit: %v", err)
	}
	w.peersProcess(commit.Transport, w.alice)
	w.hostedProcess(commit.MLS, "")
	if _, err := w.g.JoinWelcome(inst, welcome.MLS, pw, engine.NewWelcomeCache(0)); err != nil {
		t.Fatalf("join after the commit: %v", err)
	}
	st, _, err := inst.Join(welcome.MLS, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.solo[inst.ClientID()], w.insts[inst.ClientID()] = st, inst
	w.hosted = append(w.hosted, inst.ClientID())
	w.check()
	w.remoteCommit(w.bob, w.bob.Commit)
}
