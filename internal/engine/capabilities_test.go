package engine

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"slices"
	"testing"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/credentials"
	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"
	"github.com/thomas-vilte/mls-go/keypackages"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// leafListsComponents checks that leaf of s lists the components extension
// in its capabilities and that its signature verifies (mls-go's treesync
// encodes the LeafNodeTBS on its own, so a wrong re-signing fails here).
func leafListsComponents(t *testing.T, s *State, leaf uint32, what string) {
	t.Helper()
	n := s.g.GetTreeLeaf(group.LeafNodeIndex(leaf))
	if n == nil || n.LeafData == nil || n.LeafData.Capabilities == nil {
		t.Fatalf("%s: no leaf %d", what, leaf)
	}
	if !slices.Contains(n.LeafData.Capabilities.Extensions, components.ExtensionType) {
		t.Errorf("%s: leaf capabilities list extensions %#x, not 0xF0FA", what, n.LeafData.Capabilities.Extensions)
	}
	if err := n.LeafData.VerifyWithContext(s.g.CipherSuite(), s.GroupID(), leaf); err != nil {
		t.Errorf("%s: leaf signature: %v", what, err)
	}
}

// Issue 28 item 1: KeyPackages list the components extension 0xF0FA in
// their capabilities, and so do the leaves the fabric makes: the creator's
// and a commit's update path. A strict RFC 9420 peer (ts-mls) refuses to
// add a leaf that does not list every non-default GroupContext extension
// (RFC 9420 §13), and every fabric group carries 0xF0FA.
func TestKeyPackagesAndLeavesListComponentsExtension(t *testing.T) {
	alice := must[*Installation](t)(CreateInstallation(newAccount(t), 0))
	bob := must[*Installation](t)(CreateInstallation(newAccount(t), 0))
	kpMsg := must[[][]byte](t)(bob.NewKeyPackages(1))[0]
	kp := must[*keypackages.KeyPackage](t)(keypackages.UnmarshalKeyPackage(kpMsg[4:]))
	if !slices.Contains(kp.LeafNode.Capabilities.Extensions, components.ExtensionType) {
		t.Fatalf("KeyPackage capabilities list extensions %#x, not 0xF0FA", kp.LeafNode.Capabilities.Extensions)
	}
	if err := kp.Verify(kp.CipherSuite); err != nil {
		t.Fatalf("KeyPackage signature: %v", err)
	}
	if err := kp.Validate(); err != nil {
		t.Fatalf("KeyPackage: %v", err)
	}

	st := must[*State](t)(alice.CreateGroup(nil, components.Set{Admins: []components.AccountID{components.AccountID(alice.AccountID())}}))
	leafListsComponents(t, st, st.OwnLeaf(), "the creator's leaf")

	add := must[*Outgoing](t)(st.Commit(alice, CommitRequest{Add: [][]byte{kpMsg}}))
	next, _ := must2(t)(st.ProcessHandshake(add.Commit))
	leafListsComponents(t, next, 1, "bob's leaf, from his KeyPackage")
	joined, _, err := bob.Join(add.Welcomes[0], nil)
	if err != nil {
		t.Fatalf("bob joins from the Welcome: %v", err)
	}
	leafListsComponents(t, joined, 0, "alice's leaf as bob holds it")

	update := must[*Outgoing](t)(next.Commit(alice, CommitRequest{}))
	updated, _ := must2(t)(next.ProcessHandshake(update.Commit))
	if updated.Epoch() != next.Epoch()+1 {
		t.Fatal("the self-update made no new epoch")
	}
	leafListsComponents(t, updated, updated.OwnLeaf(), "alice's leaf from her update path")
}

func must2(t *testing.T) func(*State, *HandshakeResult, error) (*State, *HandshakeResult) {
	return func(s *State, r *HandshakeResult, err error) (*State, *HandshakeResult) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s, r
	}
}

// RFC 9420 §13: "A client adding a new member to a group MUST verify that
// the LeafNode for the new member is compatible with the group's
// extensions." A KeyPackage whose capabilities do not list 0xF0FA (mls-go's
// generator as is) is refused before anything is sent,
// unsupported_required_feature, so the fabric makes no add that a strict
// peer refuses; the state is unchanged.
func TestAddOfKeyPackageWithoutComponentsExtensionIsRefused(t *testing.T) {
	h := newHostedGroup(t, components.Set{Profile: &components.ProfileState{Name: "strict"}})
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cred := &credentials.CredentialWithKey{Credential: credentials.NewBasicCredential(newAccount(t)), SignatureKeyBytes: pub, Ed25519PrivateKey: priv}
	kp, _, err := keypackages.Generate(cred, ciphersuite.CipherSuite(DefaultCipherSuite))
	if err != nil {
		t.Fatal(err)
	}
	msg := (&framing.MLSMessage{KeyPackage: kp.Marshal()}).Marshal()
	before := must[[]byte](t)(h.state.Snapshot())
	_, err = h.state.Commit(h.inst, CommitRequest{Add: [][]byte{msg}})
	if !errors.Is(err, ErrUnsupportedExtension) || CategoryOf(err) != schema.CategoryUnsupportedRequiredFeature {
		t.Fatalf("add of a KeyPackage without 0xF0FA: %v (category %q), want ErrUnsupportedExtension / unsupported_required_feature", err, CategoryOf(err))
	}
	if after := must[[]byte](t)(h.state.Snapshot()); !slices.Equal(before, after) {
		t.Fatal("the refused add changed the state")
	}
}
