package engine

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func newAccount(t testing.TB) []byte {
	t.Helper()
	a := make([]byte, AccountIDLen)
	if _, err := rand.Read(a); err != nil {
		t.Fatal(err)
	}
	return a
}

func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// world is a group made by remote testpeer members with one hosted member.
type world struct {
	hosted *Installation
	state  *State
	info   *JoinInfo
	alice  *testpeer.Group // creator and admin
	bob    *testpeer.Group // ordinary member
}

func newWorld(t *testing.T) *world {
	t.Helper()
	alice := must[*testpeer.Peer](t)(testpeer.New("alice"))
	bob := must[*testpeer.Peer](t)(testpeer.New("bob"))
	ag := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{
		Admins:  []components.AccountID{alice.AccountID()},
		Profile: &components.ProfileState{Name: "team"},
	}))
	hosted := must[*Installation](t)(CreateInstallation(newAccount(t), 0))
	kps := must[[][]byte](t)(hosted.NewKeyPackages(2))
	commit, welcome, err := ag.Invite(kps[1])
	if err != nil {
		t.Fatal(err)
	}
	_ = commit
	st, info, err := hosted.Join(welcome.MLS, nil)
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	w := &world{hosted: hosted, state: st, info: info, alice: ag}
	add, joined, err := ag.Add(bob)
	if err != nil {
		t.Fatal(err)
	}
	w.bob = joined[0]
	w.apply(t, add)
	return w
}

// apply processes a handshake message on the hosted state and checks that
// it reached the same epoch authenticator as alice.
func (w *world) apply(t *testing.T, m testpeer.Message) *HandshakeResult {
	t.Helper()
	next, res, err := w.state.ProcessHandshake(m.MLS)
	if err != nil {
		t.Fatalf("process: %v", err)
	}
	w.state = next
	if res.Class == schema.ClassCommit && !bytes.Equal(w.state.EpochAuthenticator(), w.alice.EpochAuthenticator()) {
		t.Fatalf("epoch authenticator differs from the remote member's")
	}
	return res
}

func TestJoinFromWelcome(t *testing.T) {
	alice := must[*testpeer.Peer](t)(testpeer.New("alice"))
	ag := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{
		Admins:       []components.AccountID{alice.AccountID()},
		Profile:      &components.ProfileState{Name: "team"},
		Conversation: &components.ConversationState{Kind: components.KindGroup},
	}))
	hosted := must[*Installation](t)(CreateInstallation(newAccount(t), 0))
	kps := must[[][]byte](t)(hosted.NewKeyPackages(3))
	_, welcome, err := ag.Invite(kps[2])
	if err != nil {
		t.Fatal(err)
	}
	st, info, err := hosted.Join(welcome.MLS, nil)
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	if !bytes.Equal(info.GroupID, ag.ID()) || info.Epoch != ag.Epoch() || info.Adder.InboxID != alice.InboxID() ||
		!bytes.Equal(info.Adder.InstallationKey, alice.InstallationKey()) {
		t.Fatalf("join info %+v", info)
	}
	if !info.HasComponents || info.Components.Profile.Name != "team" || !components.IsAdmin(info.Components, alice.InboxID()) {
		t.Fatalf("components %+v", info.Components)
	}
	ref := must[[]byte](t)(KeyPackageRef(kps[2]))
	if !bytes.Equal(info.KeyPackageRef, ref) {
		t.Fatal("join info names another KeyPackage")
	}
	if len(hosted.KeyPackageRefs()) != 3 {
		t.Fatal("join consumed the KeyPackage; it must stay until the caller removes it")
	}
	if !hosted.RemoveKeyPackage(ref) || len(hosted.KeyPackageRefs()) != 2 {
		t.Fatal("RemoveKeyPackage")
	}
	if !bytes.Equal(st.EpochAuthenticator(), ag.EpochAuthenticator()) {
		t.Fatal("epoch authenticator differs from the inviter's")
	}
	want := []string{alice.InboxID(), hosted.InboxID()}
	slices.Sort(want)
	if !slices.Equal(st.InboxIDs(), want) {
		t.Fatalf("inboxes %v want %v", st.InboxIDs(), want)
	}
	key := must[[32]byte](t)(st.GroupEventKey())
	if key != ag.EventKey() {
		t.Fatal("group event key differs from the remote member's")
	}
	own, ok := st.Member(st.OwnLeaf())
	if !ok || own.InboxID != hosted.InboxID() || !bytes.Equal(own.InstallationKey, hosted.InstallationKey()) {
		t.Fatalf("own member %+v", own)
	}

	// A second Welcome for a KeyPackage the installation does not hold.
	other := must[*Installation](t)(CreateInstallation(newAccount(t), 0))
	if _, _, err := other.Join(welcome.MLS, nil); CategoryOf(err) != schema.CategoryWrongRecipient || !errors.Is(err, ErrNoKeyPackage) {
		t.Fatalf("join with a foreign KeyPackage: %v", err)
	}
}

// Marmot joining.md step 8: the Welcome's author must be an admin.
func TestJoinRejectsNonAdminAdder(t *testing.T) {
	alice := must[*testpeer.Peer](t)(testpeer.New("alice"))
	carol := must[*testpeer.Peer](t)(testpeer.New("carol"))
	ag := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{Admins: []components.AccountID{carol.AccountID()}}))
	hosted := must[*Installation](t)(CreateInstallation(newAccount(t), 0))
	kps := must[[][]byte](t)(hosted.NewKeyPackages(1))
	_, welcome, err := ag.Invite(kps[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := hosted.Join(welcome.MLS, nil); CategoryOf(err) != schema.CategoryAuthorizationFailed {
		t.Fatalf("join: %v", err)
	}
}

func TestLinearCommitsAndMessages(t *testing.T) {
	w := newWorld(t)
	carol := must[*testpeer.Peer](t)(testpeer.New("carol"))
	add, _, err := w.alice.Add(carol)
	if err != nil {
		t.Fatal(err)
	}
	res := w.apply(t, add)
	if _, err := w.bob.Process(add.Transport); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.AddedInboxes, []string{carol.InboxID()}) || len(res.RemovedInboxes) != 0 || !res.Privileged {
		t.Fatalf("add result %+v", res)
	}
	if res.Sender.InboxID != w.alice.Peer().InboxID() || res.MessageID != NewMessageID(add.MLS) {
		t.Fatalf("committer %+v", res.Sender)
	}

	// Generation is the sender's send order in the epoch (RFC 9420 §9),
	// whatever order the messages are opened in.
	first := must[testpeer.Message](t)(w.bob.SendText("first"))
	second := must[testpeer.Message](t)(w.bob.SendText("second"))
	for i, msg := range []testpeer.Message{second, first} {
		want := uint32(1 - i)
		if app, err := w.state.Decrypt(msg.MLS); err != nil || app.Generation != want {
			t.Fatalf("generation of message %d: %+v, %v", want, app, err)
		}
	}

	for i := range 3 {
		msg := must[testpeer.Message](t)(w.bob.SendText(fmt.Sprintf("hello %d", i)))
		app, err := w.state.Decrypt(msg.MLS)
		if err != nil {
			t.Fatalf("decrypt %d: %v", i, err)
		}
		if app.Sender.InboxID != w.bob.Peer().InboxID() || !bytes.Equal(app.Sender.InstallationKey, w.bob.Peer().InstallationKey()) {
			t.Fatalf("sender %+v", app.Sender)
		}
		p, err := apppayload.Decode(app.Payload)
		if err != nil {
			t.Fatalf("payload: %v", err)
		}
		if string(p.Content) != fmt.Sprintf("hello %d", i) || app.MessageID != NewMessageID(msg.MLS) {
			t.Fatalf("payload %+v", p)
		}
		// A ratchet key is used once: the same message does not decrypt twice.
		if _, err := w.state.Decrypt(msg.MLS); err == nil {
			t.Fatal("a message decrypted twice")
		}
		upd := must[testpeer.Message](t)(w.bob.Commit())
		if _, err := w.alice.Process(upd.Transport); err != nil {
			t.Fatal(err)
		}
		res := w.apply(t, upd)
		if res.Privileged || len(res.AddedInboxes)+len(res.RemovedInboxes)+len(res.ChangedComponents) != 0 {
			t.Fatalf("self update result %+v", res)
		}
	}

	// An app message of an older epoch is stale on the current state.
	old := must[testpeer.Message](t)(w.alice.SendText("now"))
	upd := must[testpeer.Message](t)(w.alice.Commit())
	prev := w.state
	w.apply(t, upd)
	if _, err := w.state.Decrypt(old.MLS); CategoryOf(err) != schema.CategoryStaleEpoch {
		t.Fatalf("old epoch message: %v", err)
	}
	if _, err := prev.Decrypt(old.MLS); err != nil {
		t.Fatalf("message on its own epoch's retained state: %v", err)
	}
	if _, err := w.state.Decrypt(upd.MLS); CategoryOf(err) != schema.CategoryUnsupportedRequiredFeature {
		t.Fatalf("commit given to Decrypt: %v", err)
	}
	if _, _, err := w.state.ProcessHandshake(old.MLS); CategoryOf(err) != schema.CategoryUnsupportedRequiredFeature {
		t.Fatalf("app message given to ProcessHandshake: %v", err)
	}
}

// DESIGN §3: the group event key is the epoch's exporter output. It is
// remembered per epoch, so it must follow every commit, and a retained
// state of an older epoch keeps its own.
func TestGroupEventKeyFollowsEachEpoch(t *testing.T) {
	w := newWorld(t)
	for i := range 3 {
		prev := w.state
		before := must[[32]byte](t)(prev.GroupEventKey())
		if before != w.alice.EventKey() {
			t.Fatalf("commit %d: key differs from the remote member's before it", i)
		}
		upd := must[testpeer.Message](t)(w.alice.Commit())
		w.apply(t, upd)
		after := must[[32]byte](t)(w.state.GroupEventKey())
		if after != w.alice.EventKey() || after == before {
			t.Fatalf("commit %d: key not the new epoch's", i)
		}
		if again := must[[32]byte](t)(prev.GroupEventKey()); again != before {
			t.Fatalf("commit %d: the retained state's key changed", i)
		}
	}
}

// Component changes are privileged: an ordinary member's rename is
// authorization_failed; an admin's is applied and named per EVENT-019.
func TestUnauthorizedComponentChange(t *testing.T) {
	w := newWorld(t)
	bob2 := must[*testpeer.Group](t)(w.bob.Clone())
	set := must[components.Set](t)(w.bob.Components())
	set.Profile = &components.ProfileState{Name: "mine now"}
	bad := must[testpeer.Message](t)(w.bob.SetComponents(set))
	before := w.state.EpochAuthenticator()
	_, _, err := w.state.ProcessHandshake(bad.MLS)
	if CategoryOf(err) != schema.CategoryAuthorizationFailed || !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("non-admin rename: %v", err)
	}
	if !bytes.Equal(before, w.state.EpochAuthenticator()) {
		t.Fatal("a rejected commit changed the state")
	}

	// An ordinary member adding someone is privileged too.
	dave := must[*testpeer.Peer](t)(testpeer.New("dave"))
	badAdd, _, err := bob2.Add(dave)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.state.ProcessHandshake(badAdd.MLS); CategoryOf(err) != schema.CategoryAuthorizationFailed {
		t.Fatalf("non-admin add: %v", err)
	}

	set = must[components.Set](t)(w.alice.Components())
	set.Profile = &components.ProfileState{Name: "renamed", Description: "d"}
	set.Retention = &components.RetentionState{DisappearingSecs: 3600}
	good := must[testpeer.Message](t)(w.alice.SetComponents(set))
	res := w.apply(t, good)
	want := []string{components.FieldGroupName, components.FieldDescription, components.FieldDisappearInNS}
	if !slices.Equal(res.ChangedComponents, want) || !res.Privileged || res.Components.Profile.Name != "renamed" {
		t.Fatalf("admin rename result %+v", res)
	}
	got, _, err := w.state.Components()
	if err != nil || got.Retention.DisappearingSecs != 3600 {
		t.Fatalf("components after rename: %+v %v", got, err)
	}
}

// A leave request (a Remove proposal of the member's own leaf) committed by
// another member is ordinary (DESIGN §2).
func TestLeaveRequestIsOrdinary(t *testing.T) {
	w := newWorld(t)
	leave := must[testpeer.Message](t)(w.bob.Leave())
	pres := w.apply(t, leave)
	if pres.Class != schema.ClassProposal || len(pres.ProposalRef) == 0 || pres.Sender.InboxID != w.bob.Peer().InboxID() {
		t.Fatalf("proposal result %+v", pres)
	}
	if _, err := w.alice.Process(leave.Transport); err != nil {
		t.Fatal(err)
	}
	commit := must[testpeer.Message](t)(w.alice.Commit())
	res := w.apply(t, commit)
	if !slices.EqualFunc(res.ProposalRefs, [][]byte{pres.ProposalRef}, bytes.Equal) {
		t.Fatal("the commit does not name the leave request it consumed")
	}
	if res.Privileged || !slices.Equal(res.RemovedInboxes, []string{w.bob.Peer().InboxID()}) || res.RemovedSelf {
		t.Fatalf("leave result %+v", res)
	}
}

func TestRemovedSelf(t *testing.T) {
	w := newWorld(t)
	rm, err := w.alice.Remove(w.hosted.InboxID())
	if err != nil {
		t.Fatal(err)
	}
	next, res, err := w.state.ProcessHandshake(rm.MLS)
	if err != nil {
		t.Fatalf("process own removal: %v", err)
	}
	if !res.RemovedSelf || !slices.Equal(res.RemovedInboxes, []string{w.hosted.InboxID()}) || next != nil || !res.Privileged {
		t.Fatalf("removal result %+v", res)
	}
}

// Replaying a commit against a restored snapshot of its parent equals
// processing it directly, and neither touches the parent.
func TestReplayAgainstRestoredSnapshot(t *testing.T) {
	w := newWorld(t)
	parent := w.state
	snap := must[[]byte](t)(parent.Snapshot())
	msg := must[testpeer.Message](t)(w.bob.SendText("before"))
	commit := must[testpeer.Message](t)(w.alice.Commit())

	direct, _, err := parent.ProcessHandshake(commit.MLS)
	if err != nil {
		t.Fatal(err)
	}
	restored := must[*State](t)(Restore(snap))
	replayed, _, err := restored.ProcessHandshake(commit.MLS)
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := parent.ProcessHandshake(commit.MLS)
	if err != nil {
		t.Fatalf("second processing against the same parent: %v", err)
	}
	if !bytes.Equal(direct.EpochAuthenticator(), replayed.EpochAuthenticator()) ||
		!bytes.Equal(direct.EpochAuthenticator(), again.EpochAuthenticator()) ||
		!bytes.Equal(direct.EpochAuthenticator(), w.alice.EpochAuthenticator()) {
		t.Fatal("replay reached another epoch authenticator")
	}
	if parent.Epoch()+1 != direct.Epoch() {
		t.Fatal("epochs")
	}
	// The parent still decrypts its epoch's message.
	if _, err := restored.Decrypt(msg.MLS); err != nil {
		t.Fatalf("restored parent decrypt: %v", err)
	}
	if _, err := Restore([]byte("{}")); CategoryOf(err) != schema.CategoryMissingHistory {
		t.Fatalf("restore garbage: %v", err)
	}
}

func TestProcessHandshakeRejects(t *testing.T) {
	w := newWorld(t)
	commit := must[testpeer.Message](t)(w.alice.Commit())
	w.apply(t, commit)
	if _, _, err := w.state.ProcessHandshake(commit.MLS); CategoryOf(err) != schema.CategoryStaleEpoch {
		t.Fatalf("old commit: %v", err)
	}
	next := must[testpeer.Message](t)(w.alice.Commit())
	// A damaged membership tag (the last bytes) names no parent: the input
	// waits for one (inbound processing), it is not rejected.
	tampered := bytes.Clone(next.MLS)
	tampered[len(tampered)-5] ^= 1
	if _, _, err := w.state.ProcessHandshake(tampered); CategoryOf(err) != schema.CategoryMissingHistory || !errors.Is(err, ErrNotAuthenticated) {
		t.Fatalf("tampered commit: %v", err)
	}
	future := must[testpeer.Message](t)(w.alice.Commit())
	if _, _, err := w.state.ProcessHandshake(future.MLS); CategoryOf(err) != schema.CategoryMissingHistory || !errors.Is(err, ErrFutureEpoch) {
		t.Fatalf("commit of a later epoch: %v", err)
	}
	other := newWorld(t)
	if _, _, err := other.state.ProcessHandshake(next.MLS); CategoryOf(err) != schema.CategoryWrongRecipient {
		t.Fatalf("commit of another group: %v", err)
	}
}

func TestVaultSealOpen(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	v := must[*Vault](t)(NewVault(key))
	for _, suite := range []uint16{1, 2, 3} {
		inst := must[*Installation](t)(CreateInstallation(newAccount(t), suite))
		kps := must[[][]byte](t)(inst.NewKeyPackages(2))
		sealed := must[[]byte](t)(v.Seal(inst))
		back := must[*Installation](t)(v.Open(sealed))
		if back.ClientID() != inst.ClientID() || back.InboxID() != inst.InboxID() || back.CipherSuite() != suite {
			t.Fatalf("suite %d: opened another installation", suite)
		}
		if !slices.EqualFunc(back.KeyPackageRefs(), inst.KeyPackageRefs(), bytes.Equal) {
			t.Fatalf("suite %d: KeyPackages differ", suite)
		}
		// The opened installation still joins with a KeyPackage made before sealing.
		if suite == 1 {
			alice := must[*testpeer.Peer](t)(testpeer.New("alice"))
			ag := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}}))
			_, welcome, err := ag.Invite(kps[0])
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := back.Join(welcome.MLS, nil); err != nil {
				t.Fatalf("join after open: %v", err)
			}
		}
		sealed[len(sealed)-1] ^= 1
		if _, err := v.Open(sealed); !errors.Is(err, ErrSealed) {
			t.Fatalf("tampered blob: %v", err)
		}
	}
	other := must[*Vault](t)(NewVault(make([]byte, 32)))
	inst := must[*Installation](t)(CreateInstallation(newAccount(t), 1))
	if _, err := other.Open(must[[]byte](t)(v.Seal(inst))); !errors.Is(err, ErrSealed) {
		t.Fatalf("wrong master key: %v", err)
	}
	st := must[[]byte](t)(v.SealState([]byte("state")))
	if _, err := v.Open(st); !errors.Is(err, ErrSealed) {
		t.Fatal("a sealed state opened as an installation")
	}
	if b, err := v.OpenState(st); err != nil || string(b) != "state" {
		t.Fatalf("OpenState: %q %v", b, err)
	}
	app := must[[]byte](t)(v.AppendSealState([]byte("prefix:"), []byte("state")))
	if string(app[:7]) != "prefix:" {
		t.Fatalf("AppendSealState lost its prefix: %q", app[:7])
	}
	if b, err := v.OpenState(app[7:]); err != nil || string(b) != "state" {
		t.Fatalf("OpenState of an appended seal: %q %v", b, err)
	}
	if _, err := NewVault(key[:16]); err == nil {
		t.Fatal("short master key accepted")
	}
}

// Private keys never show in formatted output.
func TestInstallationFormatHidesKeys(t *testing.T) {
	inst := must[*Installation](t)(CreateInstallation(newAccount(t), 1))
	must[[][]byte](t)(inst.NewKeyPackages(1))
	seed := hex.EncodeToString(inst.ed25519Priv.Seed())
	var init string
	for _, e := range inst.keyPackages {
		init = hex.EncodeToString(e.initPriv)
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%q"} {
		out := fmt.Sprintf(verb, inst)
		if strings.Contains(out, seed) || strings.Contains(out, init) || strings.Contains(out, hex.EncodeToString(inst.account)) {
			t.Fatalf("%s shows key material: %s", verb, out)
		}
	}
	out := fmt.Sprintf("%+v", struct{ I *Installation }{inst})
	if strings.Contains(out, seed) {
		t.Fatal("nested formatting shows the key")
	}
}

func TestCreateInstallation(t *testing.T) {
	inst := must[*Installation](t)(CreateInstallation(newAccount(t), 0))
	if inst.CipherSuite() != DefaultCipherSuite || len(inst.InstallationKey()) != 32 || inst.ClientID() != hex.EncodeToString(inst.InstallationKey()) {
		t.Fatalf("installation %v", inst)
	}
	kps := must[[][]byte](t)(inst.NewKeyPackages(2))
	for _, kp := range kps {
		c := must[Classification](t)(Classify(kp))
		if c.Class != schema.ClassKeyPackage {
			t.Fatal("not a KeyPackage message")
		}
		ref := must[[]byte](t)(KeyPackageRef(kp))
		got, ok := inst.KeyPackageMessage(ref)
		if !ok || !bytes.Equal(got, kp) {
			t.Fatal("KeyPackageMessage")
		}
	}
	if _, err := CreateInstallation(make([]byte, 31), 1); err == nil {
		t.Fatal("short account id accepted")
	}
	if _, err := CreateInstallation(newAccount(t), 7); CategoryOf(err) != schema.CategoryUnsupportedRequiredFeature {
		t.Fatalf("suite 7: %v", err)
	}
}

func TestErrorRedactsHex(t *testing.T) {
	err := &Error{Op: "x", Category: schema.CategoryInvalidEncoding, Err: errors.New("group=00112233445566778899aabbccddeeff bad")}
	if strings.Contains(err.Error(), "00112233445566778899") {
		t.Fatalf("error shows an id: %s", err)
	}
}
