package engine

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// hostedGroup is a group a hosted installation created, with testpeer
// members that joined from its Welcomes.
type hostedGroup struct {
	inst  *Installation
	state *State
	peers []*testpeer.Group
}

// transport wraps MLS bytes as a plain fabric-native/1 transport message.
func transport(group, mls []byte) schema.TransportMessage {
	return schema.TransportMessage{V: schema.TransportVersion, Group: group, Kind: schema.TransportMLS, Payload: mls}
}

// newHostedGroup creates a group as a hosted admin with the given
// components and adds one testpeer member per name, each by its KeyPackage.
func newHostedGroup(t *testing.T, set components.Set, names ...string) *hostedGroup {
	t.Helper()
	inst := must[*Installation](t)(CreateInstallation(newAccount(t), 0))
	if set.Admins == nil {
		set.Admins = []components.AccountID{components.AccountID(inst.AccountID())}
	}
	st, err := inst.CreateGroup(nil, set)
	if err != nil {
		t.Fatalf("create group: %v", err)
	}
	h := &hostedGroup{inst: inst, state: st}
	if len(names) == 0 {
		return h
	}
	var kps [][]byte
	var peers []*testpeer.Peer
	for _, n := range names {
		p := must[*testpeer.Peer](t)(testpeer.New(n))
		peers = append(peers, p)
		kps = append(kps, must[[]byte](t)(p.KeyPackage()))
	}
	out, err := st.Commit(inst, CommitRequest{Add: kps})
	if err != nil {
		t.Fatalf("commit add: %v", err)
	}
	if len(out.Welcomes) != len(names) {
		t.Fatalf("%d welcomes for %d members", len(out.Welcomes), len(names))
	}
	h.accept(t, out.Commit)
	for i, p := range peers {
		g, err := p.Join(transport(st.GroupID(), out.Welcomes[i]))
		if err != nil {
			t.Fatalf("%s joins from the hosted Welcome: %v", names[i], err)
		}
		h.peers = append(h.peers, g)
	}
	h.converged(t)
	return h
}

// accept processes an own commit that came back, as converge does.
func (h *hostedGroup) accept(t *testing.T, commit []byte) *HandshakeResult {
	t.Helper()
	next, res, err := h.state.ProcessHandshake(commit)
	if err != nil {
		t.Fatalf("own commit back: %v", err)
	}
	h.state = next
	return res
}

// toPeers hands an MLS message to every peer.
func (h *hostedGroup) toPeers(t *testing.T, mls []byte) []testpeer.Received {
	t.Helper()
	var out []testpeer.Received
	for _, g := range h.peers {
		if g.Removed() {
			continue
		}
		r, err := g.Process(transport(h.state.GroupID(), mls))
		if err != nil {
			t.Fatalf("%s processes the hosted member's message: %v", g.Peer().Name(), err)
		}
		out = append(out, r)
	}
	return out
}

func (h *hostedGroup) converged(t *testing.T) {
	t.Helper()
	for _, g := range h.peers {
		if g.Removed() {
			continue
		}
		if !bytes.Equal(g.EpochAuthenticator(), h.state.EpochAuthenticator()) {
			t.Fatalf("%s is at another epoch state (%d) than the hosted member (%d)", g.Peer().Name(), g.Epoch(), h.state.Epoch())
		}
	}
}

func encode(t *testing.T, p apppayload.Payload) []byte {
	t.Helper()
	return must[[]byte](t)(apppayload.Encode(p))
}

// EVENT-005: a hosted installation creates a group; test peers join from
// its Welcomes and decrypt what it sends; its own message coming back is
// own_echo, and it decrypts the peers' messages.
func TestHostedCreatesGroupPeersJoinAndConverse(t *testing.T) {
	h := newHostedGroup(t, components.Set{Profile: &components.ProfileState{Name: "team"}}, "bob", "carol")
	if h.state.Epoch() != 1 || len(h.state.InboxIDs()) != 3 {
		t.Fatalf("epoch %d inboxes %v", h.state.Epoch(), h.state.InboxIDs())
	}
	set := must[components.Set](t)(h.peers[0].Components())
	if set.Profile == nil || set.Profile.Name != "team" || !components.IsAdmin(set, h.inst.InboxID()) {
		t.Fatalf("bob sees components %+v", set)
	}
	text := must[[]byte](t)(h.state.Encrypt(h.inst, encode(t, apppayload.NewText("hello"))))
	ref := NewMessageID(text)
	reply, err := apppayload.NewReply(ref[:], apppayload.NewText("me again"))
	if err != nil {
		t.Fatal(err)
	}
	reaction, err := apppayload.NewReaction(apppayload.Reaction{Reference: ref[:], Action: apppayload.ReactionAdded, Content: "👍", Schema: apppayload.SchemaUnicode})
	if err != nil {
		t.Fatal(err)
	}
	deletion := must[apppayload.Payload](t)(apppayload.NewDeletion(ref[:]))
	other := apppayload.Payload{ContentType: apppayload.ContentType{AuthorityID: "example.org", TypeID: "custom", VersionMajor: 1}, Parameters: map[string]string{}, Content: []byte{0, 1, 2}}
	sent := [][]byte{text}
	for _, p := range []apppayload.Payload{reply, reaction, deletion, other} {
		sent = append(sent, must[[]byte](t)(h.state.Encrypt(h.inst, encode(t, p))))
	}
	for i, m := range sent {
		for _, r := range h.toPeers(t, m) {
			if r.Kind != testpeer.KindApplication || r.SenderInboxID != h.inst.InboxID() {
				t.Fatalf("message %d received as %+v", i, r)
			}
		}
		if _, err := h.state.Decrypt(m); !errors.Is(err, ErrOwnEcho) || CategoryOf(err) != schema.CategoryOwnEcho {
			t.Fatalf("own message %d back: %v, want own_echo", i, err)
		}
	}
	r, err := h.peers[1].Process(transport(h.state.GroupID(), sent[1]))
	if err == nil {
		t.Fatalf("a message decrypted twice: %+v", r)
	}
	bob := must[testpeer.Message](t)(h.peers[0].SendText("hi host"))
	app, err := h.state.Decrypt(bob.MLS)
	if err != nil {
		t.Fatalf("hosted decrypts bob: %v", err)
	}
	p := must[apppayload.Payload](t)(apppayload.Decode(app.Payload))
	if txt, _ := p.Text(); txt != "hi host" || app.Sender.InboxID != h.peers[0].Peer().InboxID() {
		t.Fatalf("decrypted %q from %s", txt, app.Sender.InboxID)
	}
}

// The hosted member follows a test peer's commit after its own.
func TestHostedProcessesPeerCommits(t *testing.T) {
	h := newHostedGroup(t, components.Set{}, "bob", "carol")
	up := must[testpeer.Message](t)(h.peers[0].Commit())
	if _, err := h.peers[1].Process(up.Transport); err != nil {
		t.Fatal(err)
	}
	next, res, err := h.state.ProcessHandshake(up.MLS)
	if err != nil || res.Class != schema.ClassCommit || res.Sender.InboxID != h.peers[0].Peer().InboxID() {
		t.Fatalf("peer's update: %+v %v", res, err)
	}
	h.state = next
	h.converged(t)
	msg := must[[]byte](t)(h.state.Encrypt(h.inst, encode(t, apppayload.NewText("after"))))
	h.toPeers(t, msg)
}

// Add by KeyPackage (one Welcome each), remove an inbox, change components,
// self-update: each own commit is applied when it comes back, and every
// peer reaches the same epoch state.
func TestHostedCommits(t *testing.T) {
	h := newHostedGroup(t, components.Set{Profile: &components.ProfileState{Name: "before"}}, "bob")
	dave := must[*testpeer.Peer](t)(testpeer.New("dave"))
	erin := must[*testpeer.Peer](t)(testpeer.New("erin"))
	out, err := h.state.Commit(h.inst, CommitRequest{Add: [][]byte{must[[]byte](t)(dave.KeyPackage()), must[[]byte](t)(erin.KeyPackage())}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out.Result.AddedInboxes, sorted(dave.InboxID(), erin.InboxID())) || !out.Result.Privileged {
		t.Fatalf("add result %+v", out.Result)
	}
	h.toPeers(t, out.Commit)
	res := h.accept(t, out.Commit)
	if !slices.Equal(res.AddedInboxes, out.Result.AddedInboxes) {
		t.Fatalf("accepted add %+v", res)
	}
	for i, p := range []*testpeer.Peer{dave, erin} {
		// Each Welcome is for its own member only.
		if _, err := p.Join(transport(h.state.GroupID(), out.Welcomes[1-i])); !errors.Is(err, testpeer.ErrNoKeyPackage) {
			t.Fatalf("%s joined from another member's Welcome: %v", p.Name(), err)
		}
		g, err := p.Join(transport(h.state.GroupID(), out.Welcomes[i]))
		if err != nil {
			t.Fatal(err)
		}
		h.peers = append(h.peers, g)
	}
	h.converged(t)

	out, err = h.state.Commit(h.inst, CommitRequest{Remove: []string{dave.InboxID()}})
	if err != nil {
		t.Fatal(err)
	}
	h.toPeers(t, out.Commit)
	if res := h.accept(t, out.Commit); !slices.Equal(res.RemovedInboxes, []string{dave.InboxID()}) {
		t.Fatalf("remove result %+v", res)
	}
	if !h.peers[1].Removed() {
		t.Fatal("dave was not removed")
	}
	h.converged(t)

	renamed, _, _ := h.state.Components()
	renamed.Profile = &components.ProfileState{Name: "after"}
	out, err = h.state.Commit(h.inst, CommitRequest{Components: &renamed})
	if err != nil {
		t.Fatal(err)
	}
	h.toPeers(t, out.Commit)
	if res := h.accept(t, out.Commit); !slices.Equal(res.ChangedComponents, []string{"group_name"}) {
		t.Fatalf("rename result %+v", res)
	}
	if set := must[components.Set](t)(h.peers[0].Components()); set.Profile.Name != "after" {
		t.Fatalf("bob sees %+v", set.Profile)
	}
	h.converged(t)

	before := h.state.EpochAuthenticator()
	out, err = h.state.Commit(h.inst, CommitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	h.toPeers(t, out.Commit)
	if res := h.accept(t, out.Commit); res.Privileged || len(res.AddedInboxes)+len(res.RemovedInboxes)+len(res.ChangedComponents) != 0 {
		t.Fatalf("self-update result %+v", res)
	}
	if bytes.Equal(before, h.state.EpochAuthenticator()) {
		t.Fatal("self-update did not advance the epoch")
	}
	h.converged(t)
}

func sorted(s ...string) []string { slices.Sort(s); return s }

// An own commit stays pending across a snapshot: the restored parent applies
// it when it comes back, and a competing commit of the same epoch wins over
// it without trouble.
func TestOwnCommitPendingAcrossSnapshot(t *testing.T) {
	h := newHostedGroup(t, components.Set{}, "bob")
	out := must[*Outgoing](t)(h.state.Commit(h.inst, CommitRequest{}))
	restored := must[*State](t)(Restore(must[[]byte](t)(h.state.Snapshot())))
	next, _, err := restored.ProcessHandshake(out.Commit)
	if err != nil {
		t.Fatalf("own commit on the restored parent: %v", err)
	}
	h.toPeers(t, out.Commit)
	if !bytes.Equal(next.EpochAuthenticator(), h.peers[0].EpochAuthenticator()) {
		t.Fatal("restored parent applied the own commit to another state")
	}

	// Bob's competing commit of the same parent wins instead.
	h2 := newHostedGroup(t, components.Set{}, "bob")
	if _, err := h2.state.Commit(h2.inst, CommitRequest{}); err != nil {
		t.Fatal(err)
	}
	win := must[testpeer.Message](t)(h2.peers[0].Commit())
	h2.state = must[*State](t)(func() (*State, error) { s, _, err := h2.state.ProcessHandshake(win.MLS); return s, err }())
	h2.converged(t)
	h2.toPeers(t, must[[]byte](t)(h2.state.Encrypt(h2.inst, encode(t, apppayload.NewText("on the winner")))))
}

// Leave: the own Remove proposal is ordinary, the admin peer commits it,
// and the hosted member applies its own removal (EVENT-006 cause left).
func TestHostedLeave(t *testing.T) {
	alice := must[*testpeer.Peer](t)(testpeer.New("alice"))
	ag := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}}))
	inst := must[*Installation](t)(CreateInstallation(newAccount(t), 0))
	_, welcome, err := ag.Invite(must[[][]byte](t)(inst.NewKeyPackages(1))[0])
	if err != nil {
		t.Fatal(err)
	}
	st, _, err := inst.Join(welcome.MLS, nil)
	if err != nil {
		t.Fatal(err)
	}
	leave := must[[]byte](t)(st.Leave(inst))
	own, pres, err := st.ProcessHandshake(leave)
	if err != nil || pres.Class != schema.ClassProposal || pres.Sender.InboxID != inst.InboxID() {
		t.Fatalf("own leave request back: %+v %v", pres, err)
	}
	if r, err := ag.Process(transport(ag.ID(), leave)); err != nil || r.Kind != testpeer.KindProposal {
		t.Fatalf("alice stores the leave request: %+v %v", r, err)
	}
	commit := must[testpeer.Message](t)(ag.Commit())
	_, res, err := own.ProcessHandshake(commit.MLS)
	if err != nil || !res.RemovedSelf || !slices.Equal(res.RemovedInboxes, []string{inst.InboxID()}) {
		t.Fatalf("removal after leave: %+v %v", res, err)
	}
}

// Authorization is checked before sending: a non-admin's add is
// authorization_failed and leaves the state as it was.
func TestNonAdminCommitIsRefusedBeforeSending(t *testing.T) {
	w := newWorld(t)
	kp := must[[]byte](t)(must[*testpeer.Peer](t)(testpeer.New("dave")).KeyPackage())
	before := w.state.Changes()
	_, err := w.state.Commit(w.hosted, CommitRequest{Add: [][]byte{kp}})
	if !errors.Is(err, ErrUnauthorized) || CategoryOf(err) != schema.CategoryAuthorizationFailed {
		t.Fatalf("non-admin add: %v", err)
	}
	rename, _, _ := w.state.Components()
	rename.Profile = &components.ProfileState{Name: "mine"}
	if _, err := w.state.Commit(w.hosted, CommitRequest{Components: &rename}); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("non-admin rename: %v", err)
	}
	if w.state.Changes() != before || len(w.state.pending) != 0 {
		t.Fatal("a refused commit changed the state")
	}
	// A self-update is ordinary.
	if _, err := w.state.Commit(w.hosted, CommitRequest{}); err != nil {
		t.Fatalf("non-admin self-update: %v", err)
	}
	other := must[*Installation](t)(CreateInstallation(newAccount(t), 0))
	if _, err := w.state.Encrypt(other, []byte("x")); !errors.Is(err, ErrNotOwnInstallation) {
		t.Fatalf("encrypt as another installation: %v", err)
	}
	if _, err := w.state.Commit(w.hosted, CommitRequest{Remove: []string{"00"}}); !errors.Is(err, ErrNoMember) {
		t.Fatalf("remove of no member: %v", err)
	}
}

// GMOD-031: a peer's leave request the hosted admin holds is committed by
// its next commit, by reference; the peer is removed.
func TestHostedCommitIncludesLeaveRequest(t *testing.T) {
	h := newHostedGroup(t, components.Set{}, "bob", "carol")
	leave := must[testpeer.Message](t)(h.peers[0].Leave())
	if _, err := h.peers[1].Process(leave.Transport); err != nil {
		t.Fatal(err)
	}
	next, _, err := h.state.ProcessHandshake(leave.MLS)
	if err != nil {
		t.Fatal(err)
	}
	h.state = next
	out := must[*Outgoing](t)(h.state.Commit(h.inst, CommitRequest{}))
	if len(out.Result.ProposalRefs) != 1 || !slices.Equal(out.Result.RemovedInboxes, []string{h.peers[0].Peer().InboxID()}) || out.Result.Privileged {
		t.Fatalf("commit of the leave request %+v", out.Result)
	}
	h.toPeers(t, out.Commit)
	h.accept(t, out.Commit)
	if !h.peers[0].Removed() {
		t.Fatal("bob was not removed")
	}
	h.converged(t)
}
