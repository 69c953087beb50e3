package engine

import (
	"bytes"
	"encoding/hex"
	"errors"
	"slices"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/credentials"
	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"
	"github.com/thomas-vilte/mls-go/keypackages"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Sentinel causes of the outbound half.
var (
	// ErrNotOwnInstallation: the installation given to sign is not the
	// state's own leaf.
	ErrNotOwnInstallation = errors.New("installation is not the state's own leaf")
	// ErrOwnEcho: an application message this state encrypted came back;
	// it is accounted for already (Marmot category own_echo).
	ErrOwnEcho = errors.New("own message")
	// ErrNoMember: a Remove names an inbox with no leaf the committer may
	// remove.
	ErrNoMember = errors.New("no such member")
	// ErrEmptyCommit: a commit request that asks for nothing.
	ErrEmptyCommit = errors.New("empty commit request")
)

// maxPendingCommits bounds the own commits a state remembers: one per
// attempt on the same parent epoch.
const maxPendingCommits = 8

// maxSentIDs bounds the own application message ids a state remembers in
// one epoch (32 bytes each in its snapshot): the last 4096 to 8191. An own
// message that comes back after more later ones no longer decrypts (its key
// is used) and fails as any undecryptable message does.
const maxSentIDs = 4096

// signer returns the installation's signature key for mls-go.
func (inst *Installation) signer() *ciphersuite.SignaturePrivateKey {
	if inst.ed25519Priv != nil {
		return ciphersuite.NewEd25519SignaturePrivateKey(inst.ed25519Priv)
	}
	return ciphersuite.NewSignaturePrivateKey(inst.ecdsaPriv)
}

func (inst *Installation) credential() *credentials.CredentialWithKey {
	cred := &credentials.CredentialWithKey{
		Credential:        credentials.NewBasicCredential(slices.Clone(inst.account)),
		SignatureKeyBytes: slices.Clone(inst.sigPub),
	}
	if inst.ed25519Priv != nil {
		cred.Ed25519PrivateKey = inst.ed25519Priv
	} else {
		cred.PrivateKey, cred.SignatureKey = inst.ecdsaPriv, &inst.ecdsaPriv.PublicKey
	}
	return cred
}

// CreateGroup creates a group at epoch 0 with the installation as its only
// member, carrying set as the components extension (EVENT-005: origin
// created). A nil groupID makes 32 random bytes.
func (inst *Installation) CreateGroup(groupID []byte, set components.Set) (*State, error) {
	const op = "create group"
	ext, err := components.ToExtension(set)
	if err != nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	id := group.NewGroupID(slices.Clone(groupID))
	if groupID == nil {
		if id, err = group.NewGroupIDRandom(); err != nil {
			return nil, fail(op, schema.CategoryInvalidEncoding, err)
		}
	}
	kp, priv, err := components.GenerateKeyPackage(inst.credential(), inst.suite)
	if err != nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	g, err := group.NewGroup(id, inst.suite, kp, priv, group.WithExtensions([]group.Extension{ext}))
	if err != nil {
		return nil, classifyMLSGoError(op, err)
	}
	return &State{g: g}, nil
}

// checkSigner rejects an installation that is not the state's own leaf.
func (s *State) checkSigner(op string, inst *Installation) error {
	own, ok := s.Member(s.OwnLeaf())
	if !ok || !bytes.Equal(own.InstallationKey, inst.sigPub) {
		return fail(op, schema.CategoryWrongRecipient, ErrNotOwnInstallation)
	}
	return nil
}

// Encrypt encrypts payload (an app payload, internal/apppayload) as an
// application PrivateMessage of this epoch and returns the MLSMessage. It
// advances the own sending ratchet in place (RFC 9420 §9), so snapshot s
// afterwards; the message's id is remembered, so when it comes back
// [State.Decrypt] reports [ErrOwnEcho] instead of failing on the used key.
func (s *State) Encrypt(inst *Installation, payload []byte) (msg []byte, err error) {
	const op = "encrypt"
	defer recoverDecode(op, &err)
	if err := s.checkSigner(op, inst); err != nil {
		return nil, err
	}
	s.changes++
	pm, err := s.g.SendMessage(payload, inst.signer())
	if err != nil {
		return nil, classifyMLSGoError(op, err)
	}
	msg = framing.NewMLSMessagePrivate(pm).Marshal()
	id := NewMessageID(msg)
	s.sent = append(s.sent, id[:])
	if len(s.sent) >= 2*maxSentIDs {
		s.sent = slices.Clone(s.sent[maxSentIDs:])
	}
	return msg, nil
}

// CommitRequest is what an own commit changes, beside the proposals the
// state holds (a leave request, for one), which every commit includes. An
// empty request is a self-update: a commit with an update path
// (post-compromise security).
type CommitRequest struct {
	// Add are KeyPackages (MLSMessage or bare) of members to add; each gets
	// its own Welcome.
	Add [][]byte
	// Remove are inbox ids whose every leaf is removed (the own leaf
	// excepted: a member leaves by a leave request).
	Remove []string
	// Components, when set, replaces the components extension through a
	// GroupContextExtensions proposal.
	Components *components.Set
	// Proposals are received proposals (PublicMessage bytes) of this epoch
	// that the state does not hold itself (convergence keeps them beside
	// it): applied to the copy first, so the commit includes them by
	// reference.
	Proposals [][]byte
}

// Outgoing is an own commit: the MLSMessage to publish, one Welcome per
// added member (in the order of CommitRequest.Add), and the commit's
// result as the group will see it once it is accepted.
type Outgoing struct {
	Commit   []byte
	Welcomes [][]byte
	Result   *HandshakeResult
}

// Commit makes an own commit of req on a copy of s, authorized against s as
// any member's commit is (authorization_failed when the own inbox may not
// make the change: nothing is produced then). It does not advance s: the
// commit is pending until it comes back as input and is accepted on the
// canonical branch. s remembers the state after it (in its snapshot too),
// so [State.ProcessHandshake] of that commit on s returns it; mls-go cannot
// process a member's own commit otherwise.
func (s *State) Commit(inst *Installation, req CommitRequest) (out *Outgoing, err error) {
	const op = "commit"
	defer recoverDecode(op, &err)
	if err := s.checkSigner(op, inst); err != nil {
		return nil, err
	}
	// The proposals the state holds, and those given, are committed too,
	// by reference, as every member's commit does; base is the state that
	// holds them all, against which the commit is authorized.
	base := s
	for _, p := range req.Proposals {
		b, res, err := base.ProcessHandshake(p)
		if err != nil {
			return nil, err
		}
		if res.Class != schema.ClassProposal {
			return nil, fail(op, schema.CategoryInvalidEncoding, ErrNotHandshake)
		}
		base = b
	}
	next, err := base.Clone()
	if err != nil {
		return nil, err
	}
	next.pending, next.sent = nil, nil
	g := next.g
	var added []*keypackages.KeyPackage
	for _, b := range req.Add {
		kp, err := parseAnyKeyPackage(b)
		if err != nil {
			return nil, err
		}
		if kp.CipherSuite != g.CipherSuite() {
			return nil, fail(op, schema.CategoryUnsupportedRequiredFeature, ErrCipherSuite)
		}
		if kp.LeafNode.Capabilities == nil || !components.Supports(kp.LeafNode.Capabilities.Extensions, g.GroupContext().Extensions) {
			return nil, fail(op, schema.CategoryUnsupportedRequiredFeature, ErrUnsupportedExtension)
		}
		if _, err := g.AddMember(kp); err != nil {
			return nil, classifyMLSGoError(op, err)
		}
		added = append(added, kp)
	}
	for _, inbox := range req.Remove {
		found := false
		for _, m := range base.Members() {
			if m.InboxID == inbox && m.Leaf != base.OwnLeaf() {
				if _, err := g.RemoveMember(group.LeafNodeIndex(m.Leaf)); err != nil {
					return nil, classifyMLSGoError(op, err)
				}
				found = true
			}
		}
		if !found {
			return nil, fail(op, schema.CategoryWrongRecipient, ErrNoMember)
		}
	}
	if req.Components != nil {
		ext, err := components.ToExtension(*req.Components)
		if err != nil {
			return nil, fail(op, schema.CategoryInvalidEncoding, err)
		}
		exts := []group.Extension{ext}
		for _, e := range g.GroupContext().Extensions {
			if uint16(e.Type) != components.ExtensionType {
				exts = append(exts, e)
			}
		}
		g.Proposals().AddProposal(group.NewGroupContextExtensionsProposal(exts), g.OwnLeafIndex())
	}
	sig := inst.signer()
	staged, err := g.Commit(sig, sig.PublicKey(), nil)
	if err != nil {
		return nil, classifyMLSGoError(op, err)
	}
	ac := staged.AuthenticatedContent()
	pm := &framing.PublicMessage{Content: ac.Content, Auth: ac.Auth, MembershipTag: staged.MembershipTag()}
	commit := framing.NewMLSMessagePublic(pm).Marshal()
	own, _ := base.Member(base.OwnLeaf())
	ops, shape, err := base.commitOps(pm, own)
	if err != nil {
		return nil, err
	}
	if err := g.MergeCommit(staged); err != nil {
		return nil, classifyMLSGoError(op, err)
	}
	res := &HandshakeResult{Class: schema.ClassCommit, MessageID: NewMessageID(commit), Sender: own, ProposalRefs: shape.refs}
	if err := base.authorizeCommit(op, next, ops, res); err != nil {
		return nil, err
	}
	out = &Outgoing{Commit: commit, Result: res}
	for _, kp := range added {
		w, err := g.CreateWelcomeWithOpts([]*keypackages.KeyPackage{kp}, sig,
			group.WithJoinerSecret(staged.JoinerSecret()),
			group.WithPSKIDs(staged.PskIDs()),
			group.WithPSKSecret(staged.RawPskSecret()),
			group.WithStagedCommit(staged),
			group.WithGroupInfoOptions(group.WithRatchetTree(true)),
		)
		if err != nil {
			return nil, classifyMLSGoError(op, err)
		}
		out.Welcomes = append(out.Welcomes, (&framing.MLSMessage{Welcome: w.Marshal()}).Marshal())
	}
	snap, err := next.Snapshot()
	if err != nil {
		return nil, err
	}
	s.changes++
	s.pending = append(s.pending, pendingCommit{id: res.MessageID[:], state: snap})
	if len(s.pending) > maxPendingCommits {
		s.pending = slices.Delete(s.pending, 0, 1)
	}
	return out, nil
}

// authorizeCommit checks a commit from s to next against s's components
// and fills the result's component and membership changes.
func (s *State) authorizeCommit(op string, next *State, ops []components.Op, res *HandshakeResult) error {
	parentSet, _, err := s.Components()
	if err != nil {
		return err
	}
	nextSet, _, err := next.Components()
	if err != nil {
		return err
	}
	if err := components.Authorize(parentSet, nextSet, accountOf(res.Sender.InboxID), ops); err != nil {
		return fail(op, schema.CategoryAuthorizationFailed, ErrUnauthorized)
	}
	res.Privileged = components.Privileged(parentSet, nextSet, ops)
	res.Components = nextSet
	res.ChangedComponents = components.Diff(parentSet, nextSet)
	s.membershipDiff(next, res)
	return nil
}

// Leave returns a leave request: a Remove proposal of the own leaf as a
// PublicMessage, for another member to commit (DESIGN §2, GMOD-031). s is
// unchanged; the proposal is stored when it comes back as input.
func (s *State) Leave(inst *Installation) (msg []byte, err error) {
	const op = "leave"
	defer recoverDecode(op, &err)
	if err := s.checkSigner(op, inst); err != nil {
		return nil, err
	}
	c, err := s.Clone()
	if err != nil {
		return nil, err
	}
	p, err := c.g.RemoveMember(c.g.OwnLeafIndex())
	if err != nil {
		return nil, classifyMLSGoError(op, err)
	}
	msg, err = c.g.SignProposalAsPublicMessage(p, inst.signer())
	if err != nil {
		return nil, classifyMLSGoError(op, err)
	}
	return msg, nil
}

// pendingCommit is an own commit's id and the snapshot of the state after it.
type pendingCommit struct {
	id    []byte
	state []byte
}

// ownCommit returns the state after an own commit s made, or nil.
func (s *State) ownCommit(id MessageID) (*State, error) {
	for _, p := range s.pending {
		if bytes.Equal(p.id, id[:]) {
			next, err := restore(p.state, false)
			if err != nil {
				return nil, err
			}
			next.sigs = s.sigs
			return next, nil
		}
	}
	return nil, nil
}

// isSent reports whether s encrypted the message with this id.
func (s *State) isSent(id MessageID) bool {
	return slices.ContainsFunc(s.sent, func(b []byte) bool { return bytes.Equal(b, id[:]) })
}

func parseAnyKeyPackage(b []byte) (*keypackages.KeyPackage, error) {
	if c, err := Classify(b); err == nil && c.WireFormat == WireKeyPackage {
		kp, _, err := parseKeyPackageMessage(b)
		return kp, err
	}
	kp, err := keypackages.UnmarshalKeyPackage(b)
	if err != nil {
		return nil, fail("key package", schema.CategoryInvalidEncoding, err)
	}
	return kp, nil
}

// KeyPackageInboxID returns the inbox id (lowercase hex of the credential
// identity) of a KeyPackage (MLSMessage or bare), checking that it parses.
func KeyPackageInboxID(keyPackage []byte) (string, error) {
	kp, err := parseAnyKeyPackage(keyPackage)
	if err != nil {
		return "", err
	}
	if kp.LeafNode == nil || kp.LeafNode.Credential == nil || len(kp.LeafNode.Credential.Identity) != AccountIDLen {
		return "", fail("key package", schema.CategoryInvalidEncoding, errors.New("key package has no 32-byte account id"))
	}
	return hex.EncodeToString(kp.LeafNode.Credential.Identity), nil
}
