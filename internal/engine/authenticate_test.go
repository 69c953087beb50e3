package engine

import (
	"bytes"
	"crypto/rand"
	"errors"
	"slices"
	"testing"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/schedule"

	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// publicOf decodes a PublicMessage for a test to alter.
func publicOf(t *testing.T, b []byte) *framing.PublicMessage {
	t.Helper()
	m, err := framing.UnmarshalMLSMessage(b)
	if err != nil {
		t.Fatal(err)
	}
	pm, ok := m.AsPublic()
	if !ok {
		t.Fatal("not a PublicMessage")
	}
	return pm
}

// retag recomputes pm's membership tag under key and st's GroupContext, as
// a member of st's epoch (or an attacker with key) could.
func retag(st *State, pm *framing.PublicMessage, key []byte) []byte {
	ac := &framing.AuthenticatedContent{
		WireFormat: framing.WireFormatPublicMessage, Content: pm.Content, Auth: pm.Auth,
		GroupContext: st.g.GroupContext().Marshal(),
	}
	pm.MembershipTag = schedule.ComputeMembershipTag(st.g.CipherSuite(), key, ac.MarshalTBM())
	return framing.NewMLSMessagePublic(pm).Marshal()
}

func wantAuth(t *testing.T, st *State, msg []byte, want bool, what string) {
	t.Helper()
	got, err := st.Authenticates(msg)
	if err != nil || got != want {
		t.Fatalf("%s: Authenticates = %v, %v; want %v", what, got, err, want)
	}
}

// TestAuthenticatesIdentifiesParent: only the state of the message's own
// group, epoch and branch authenticates it; ProcessHandshake then tells a
// state that is not the parent (missing_history) from a bad signature on the
// parent (invalid_signature, terminal) (inbound processing).
func TestAuthenticatesIdentifiesParent(t *testing.T) {
	w := newWorld(t)
	parent := w.state
	before := parent.EpochAuthenticator()

	// Two competing commits from the parent epoch, then one more on branch x.
	forks := must[[]testpeer.Message](t)(w.alice.Fork(2))
	x, y := forks[0], forks[1]
	wantAuth(t, parent, x.MLS, true, "genuine commit")
	wantAuth(t, parent, y.MLS, true, "competing genuine commit")
	if !bytes.Equal(parent.EpochAuthenticator(), before) {
		t.Fatal("Authenticates changed the state")
	}
	sx, _, err := parent.ProcessHandshake(x.MLS)
	if err != nil {
		t.Fatal(err)
	}
	sy, _, err := parent.ProcessHandshake(y.MLS)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.alice.Adopt(x); err != nil {
		t.Fatal(err)
	}
	z := must[testpeer.Message](t)(w.alice.Commit())
	wantAuth(t, sx, z.MLS, true, "commit on its own branch")
	// Same epoch number, another branch's secrets.
	wantAuth(t, sy, z.MLS, false, "commit of another branch")
	if _, _, err := sy.ProcessHandshake(z.MLS); CategoryOf(err) != schema.CategoryMissingHistory || !errors.Is(err, ErrNotAuthenticated) {
		t.Fatalf("commit against another branch's state: %v", err)
	}
	// Other epochs and another group.
	wantAuth(t, parent, z.MLS, false, "commit of a later epoch")
	wantAuth(t, sx, x.MLS, false, "commit of an earlier epoch")
	other := newWorld(t)
	wantAuth(t, other.state, x.MLS, false, "commit of another group")

	// A proposal authenticates like a commit.
	if _, err := w.bob.Process(x.Transport); err != nil {
		t.Fatal(err)
	}
	leave := must[testpeer.Message](t)(w.bob.Leave())
	wantAuth(t, sx, leave.MLS, true, "genuine proposal")
	wantAuth(t, sy, leave.MLS, false, "proposal of another branch")
}

// TestAuthenticatesRejectsForgedTag: a tag that is altered, or computed under
// another key, does not authenticate; a tag computed under the epoch's
// membership key over a forged signature does, and the signature failure is
// then terminal invalid_signature.
func TestAuthenticatesRejectsForgedTag(t *testing.T) {
	w := newWorld(t)
	st := w.state
	genuine := must[testpeer.Message](t)(w.alice.Commit())

	flipped := publicOf(t, genuine.MLS)
	flipped.MembershipTag = slices.Clone(flipped.MembershipTag)
	flipped.MembershipTag[0] ^= 1
	wantAuth(t, st, framing.NewMLSMessagePublic(flipped).Marshal(), false, "altered tag")

	wrongKey := make([]byte, len(st.g.EpochSecrets().MembershipKey.AsSlice()))
	if _, err := rand.Read(wrongKey); err != nil {
		t.Fatal(err)
	}
	wantAuth(t, st, retag(st, publicOf(t, genuine.MLS), wrongKey), false, "tag under another key")

	short := publicOf(t, genuine.MLS)
	short.MembershipTag = short.MembershipTag[:8]
	wantAuth(t, st, framing.NewMLSMessagePublic(short).Marshal(), false, "truncated tag")

	forged := publicOf(t, genuine.MLS)
	sig := slices.Clone(forged.Auth.Signature.AsSlice())
	sig[len(sig)-1] ^= 1
	forged.Auth.Signature = ciphersuite.NewSignature(sig)
	badSig := retag(st, forged, st.g.EpochSecrets().MembershipKey.AsSlice())
	wantAuth(t, st, badSig, true, "forged signature under a genuine tag")
	if _, _, err := st.ProcessHandshake(badSig); CategoryOf(err) != schema.CategoryInvalidSignature || !errors.Is(err, ErrSignature) {
		t.Fatalf("forged signature on the identified parent: %v", err)
	}
	if _, _, err := st.ProcessHandshake(genuine.MLS); err != nil {
		t.Fatalf("genuine commit after the forgeries: %v", err)
	}
}

// TestAuthenticatesErrors: a non-member sender carries no tag; what is not
// a PublicMessage handshake, or does not decode, fails with a category.
func TestAuthenticatesErrors(t *testing.T) {
	w := newWorld(t)
	commit := must[testpeer.Message](t)(w.alice.Commit())
	ext := publicOf(t, commit.MLS)
	ext.Content.Sender = framing.Sender{Type: framing.SenderTypeExternal}
	if ok, err := w.state.Authenticates(framing.NewMLSMessagePublic(ext).Marshal()); ok || CategoryOf(err) != schema.CategoryMissingHistory || !errors.Is(err, ErrNoMembershipTag) {
		t.Fatalf("external sender: %v, %v", ok, err)
	}
	app := must[testpeer.Message](t)(w.bob.SendText("hi"))
	if ok, err := w.state.Authenticates(app.MLS); ok || CategoryOf(err) != schema.CategoryUnsupportedRequiredFeature || !errors.Is(err, ErrNotHandshake) {
		t.Fatalf("application message: %v, %v", ok, err)
	}
	for _, b := range [][]byte{nil, commit.MLS[:len(commit.MLS)/2]} {
		if ok, err := w.state.Authenticates(b); ok || CategoryOf(err) != schema.CategoryInvalidEncoding {
			t.Fatalf("malformed: %v, %v", ok, err)
		}
	}
}

// TestProposalRefsMatchConsumed: the refs the engine computes for proposals
// are the ones the committer's commit consumes, before and after processing.
func TestProposalRefsMatchConsumed(t *testing.T) {
	w := newWorld(t)
	carol := must[*testpeer.Peer](t)(testpeer.New("carol"))
	add, joined, err := w.alice.Add(carol)
	if err != nil {
		t.Fatal(err)
	}
	w.apply(t, add)
	if _, err := w.bob.Process(add.Transport); err != nil {
		t.Fatal(err)
	}
	var refs [][]byte
	for _, leaver := range []*testpeer.Group{w.bob, joined[0]} {
		leave := must[testpeer.Message](t)(leaver.Leave())
		ref := must[[]byte](t)(w.state.ProposalRef(leave.MLS))
		res := w.apply(t, leave)
		if !bytes.Equal(res.ProposalRef, ref) {
			t.Fatal("ProposalRef differs from the processed proposal's")
		}
		if _, err := w.alice.Process(leave.Transport); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	commit := must[testpeer.Message](t)(w.alice.Commit())
	consumed := must[[][]byte](t)(ConsumedProposalRefs(commit.MLS))
	sorted := func(r [][]byte) [][]byte {
		r = slices.Clone(r)
		slices.SortFunc(r, bytes.Compare)
		return r
	}
	if !slices.EqualFunc(sorted(consumed), sorted(refs), bytes.Equal) {
		t.Fatalf("commit consumes %d refs, not the two leave requests", len(consumed))
	}
	res := w.apply(t, commit)
	if !slices.EqualFunc(res.ProposalRefs, consumed, bytes.Equal) {
		t.Fatal("HandshakeResult.ProposalRefs differs from ConsumedProposalRefs")
	}
	if len(res.RemovedInboxes) != 2 {
		t.Fatalf("commit removed %v", res.RemovedInboxes)
	}

	empty := must[testpeer.Message](t)(w.alice.Commit())
	if r, err := ConsumedProposalRefs(empty.MLS); err != nil || len(r) != 0 {
		t.Fatalf("empty commit: %v, %v", r, err)
	}
	if _, err := w.state.ProposalRef(empty.MLS); CategoryOf(err) != schema.CategoryInvalidEncoding {
		t.Fatalf("ProposalRef of a commit: %v", err)
	}
	leave := must[testpeer.Message](t)(w.alice.Leave())
	if _, err := ConsumedProposalRefs(leave.MLS); CategoryOf(err) != schema.CategoryInvalidEncoding {
		t.Fatalf("ConsumedProposalRefs of a proposal: %v", err)
	}
	for _, b := range [][]byte{nil, {0, 1, 0, 1}, empty.MLS[:20]} {
		if _, err := ConsumedProposalRefs(b); CategoryOf(err) == "" {
			t.Fatalf("malformed commit: %v", err)
		}
		if _, err := w.state.ProposalRef(b); CategoryOf(err) == "" {
			t.Fatalf("malformed proposal: %v", err)
		}
	}
}
