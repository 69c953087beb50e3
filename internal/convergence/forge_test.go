package convergence

import (
	"slices"
	"testing"
	"time"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/schedule"

	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// forge returns m with a broken sender signature; with member it also
// recomputes the membership tag under the parent's membership key, as a
// member of that epoch could.
func forge(t *testing.T, w *world, m testpeer.Message, member bool) testpeer.Message {
	t.Helper()
	pm, err := public(m.MLS)
	if err != nil {
		t.Fatal(err)
	}
	sig := slices.Clone(pm.Auth.Signature.AsSlice())
	sig[len(sig)-1] ^= 1
	pm.Auth.Signature = ciphersuite.NewSignature(sig)
	if member {
		a, err := authOf(w.joined)
		if err != nil {
			t.Fatal(err)
		}
		ac := &framing.AuthenticatedContent{WireFormat: framing.WireFormatPublicMessage, Content: pm.Content, Auth: pm.Auth, GroupContext: a.gc}
		pm.MembershipTag = schedule.ComputeMembershipTag(a.suite, a.key.AsSlice(), ac.MarshalTBM())
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
