package convergence

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/schedule"

	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// membershipKey reads st's cipher suite, membership key and GroupContext
// out of its snapshot: what a member of that epoch holds, so a test can
// forge as that member could.
func membershipKey(t *testing.T, st *engine.State) (ciphersuite.CipherSuite, []byte, []byte) {
	t.Helper()
	var env struct {
		State struct {
			GroupContext []byte `json:"group_context"`
			EpochSecrets struct {
				MembershipKey []byte `json:"membership_key"`
			} `json:"epoch_secrets"`
		} `json:"state"`
	}
	if err := json.Unmarshal(must[[]byte](t)(st.Snapshot()), &env); err != nil {
		t.Fatal(err)
	}
	if len(env.State.EpochSecrets.MembershipKey) == 0 {
		t.Fatal("snapshot without membership key")
	}
	return ciphersuite.CipherSuite(st.CipherSuite()), env.State.EpochSecrets.MembershipKey, env.State.GroupContext
}

// forge returns m with a broken sender signature; with member it also
// recomputes the membership tag under the parent's membership key, as a
// member of that epoch could.
func forge(t *testing.T, w *world, m testpeer.Message, member bool) testpeer.Message {
	t.Helper()
	msg, err := framing.UnmarshalMLSMessage(m.MLS)
	if err != nil {
		t.Fatal(err)
	}
	pm, ok := msg.AsPublic()
	if !ok {
		t.Fatal("not a PublicMessage")
	}
	sig := slices.Clone(pm.Auth.Signature.AsSlice())
	sig[len(sig)-1] ^= 1
	pm.Auth.Signature = ciphersuite.NewSignature(sig)
	if member {
		suite, key, gc := membershipKey(t, w.joined)
		ac := &framing.AuthenticatedContent{WireFormat: framing.WireFormatPublicMessage, Content: pm.Content, Auth: pm.Auth, GroupContext: gc}
		pm.MembershipTag = schedule.ComputeMembershipTag(suite, key, ac.MarshalTBM())
	}
	return testpeer.Message{MLS: framing.NewMLSMessagePublic(pm).Marshal()}
}

// TestBadSignatureOnIdentifiedParent: once the membership tag identifies the
// parent, a failed sender signature is terminal invalid_signature with no
// disposition; without a matching membership tag nothing identifies a
// parent, and at the anchor's epoch no other parent can be retained, so it
// is stale rather than a signature failure (errors.md, "Dispositions").
func TestBadSignatureOnIdentifiedParent(t *testing.T) {
	w := newWorld(t)
	x1 := commit(t, clone(t, w.bob))
	g := w.fresh()
	bad := forge(t, w, x1, true)
	admit(t, g, t0, bad)
	wantOutcome(t, g, bad, "", schema.CategoryInvalidSignature, "")
	unknown := forge(t, w, x1, false)
	admit(t, g, t0, unknown)
	wantOutcome(t, g, unknown, schema.DispositionStale, schema.CategoryStaleEpoch, "")
	if _, open := g.Deadline(); open {
		t.Fatal("invalid input opened a pass")
	}
	admit(t, g, t0.Add(time.Second), x1)
	settle(t, g)
	wantOutcome(t, g, x1, schema.DispositionAccepted, "", "")
}
