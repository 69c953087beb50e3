package testpeer

import (
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"
	"github.com/thomas-vilte/mls-go/keypackages"

	"github.com/fabric-mls/fabric/internal/binding"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// retainedKeys is how many epochs' group event keys a member keeps to peel
// sealed input: the tip and max_rewind_commits (5) before it.
const retainedKeys = 6

// Message is what a member produced: the transport message to hand to the
// fabric or to other peers, the MLSMessage inside it and its message id.
type Message struct {
	Transport schema.TransportMessage
	// MLS is the MLSMessage the transport message carries.
	MLS []byte
	// ID is the message id: SHA-256 of MLS.
	ID []byte
	// Epoch is the epoch the message was sent in (a commit's parent epoch).
	Epoch uint64
}

// Group is one member's state of an MLS group.
type Group struct {
	peer     *Peer
	state    *group.Group
	sealed   bool
	noTree   bool              // Welcomes without the ratchet_tree extension
	keys     []epochKey        // oldest first
	own      map[string]bool   // ids of messages this member produced
	branches map[string]*Group // states after the commits of Branch, by message id
	removed  bool
	leaveRef []byte // ProposalRef of the member's pending leave request
}

type epochKey struct {
	epoch uint64
	key   [binding.KeySize]byte
}

// ErrRemoved is returned when a member that a commit removed is asked to
// send or commit.
var ErrRemoved = errors.New("testpeer: member was removed from the group")

// CreateGroup creates a one-member group at epoch 0 whose GroupContext
// carries set as the components extension.
func (p *Peer) CreateGroup(set components.Set) (*Group, error) {
	ext, err := components.ToExtension(set)
	if err != nil {
		return nil, fmt.Errorf("testpeer %s: create group: %w", p.name, err)
	}
	id, err := group.NewGroupIDRandom()
	if err != nil {
		return nil, fmt.Errorf("testpeer %s: create group: %w", p.name, err)
	}
	kp, priv, err := components.GenerateKeyPackage(p.cred, CipherSuite)
	if err != nil {
		return nil, fmt.Errorf("testpeer %s: create group: %w", p.name, err)
	}
	st, err := group.NewGroup(id, CipherSuite, kp, priv, group.WithExtensions([]group.Extension{ext}))
	if err != nil {
		return nil, fmt.Errorf("testpeer %s: create group: %w", p.name, err)
	}
	return p.newGroup(st)
}

func (p *Peer) newGroup(st *group.Group) (*Group, error) {
	g := &Group{peer: p, state: st, own: map[string]bool{}, branches: map[string]*Group{}}
	if err := g.recordKey(); err != nil {
		return nil, err
	}
	return g, nil
}

// Join joins a group from a Welcome addressed to one of the peer's
// KeyPackages. The Welcome's GroupInfo carries the ratchet tree.
func (p *Peer) Join(welcome schema.TransportMessage) (*Group, error) {
	raw, err := binding.Peel(welcome, nil)
	if err != nil {
		return nil, fmt.Errorf("testpeer %s: join: %w", p.name, err)
	}
	m, err := framing.UnmarshalMLSMessage(raw)
	if err != nil || m.Welcome == nil {
		return nil, fmt.Errorf("testpeer %s: join: not an MLS welcome", p.name)
	}
	w, err := group.UnmarshalWelcome(m.Welcome)
	if err != nil {
		return nil, fmt.Errorf("testpeer %s: join: %w", p.name, err)
	}
	for k, pk := range p.pending {
		st, err := group.JoinFromWelcome(w, pk.kp, pk.priv, nil)
		if err != nil {
			continue
		}
		delete(p.pending, k)
		return p.newGroup(st)
	}
	return nil, fmt.Errorf("testpeer %s: join: %w", p.name, ErrNoKeyPackage)
}

// Peer returns the member's peer.
func (g *Group) Peer() *Peer { return g.peer }

// ID returns the MLS group id.
func (g *Group) ID() []byte { return append([]byte{}, g.state.ID().AsSlice()...) }

// Epoch returns the current epoch.
func (g *Group) Epoch() uint64 { return g.state.Epoch().AsUint64() }

// EpochAuthenticator returns the current epoch authenticator; members in the
// same state have the same one.
func (g *Group) EpochAuthenticator() []byte { return g.state.EpochAuthenticator() }

// OwnLeaf returns the member's leaf index.
func (g *Group) OwnLeaf() uint32 { return uint32(g.state.OwnLeafIndex()) }

// Removed reports whether a processed commit removed this member.
func (g *Group) Removed() bool { return g.removed }

// SetSealed makes the member emit transport messages of kind sealed, under
// the group event key of the epoch each is sent in, instead of kind mls.
// Welcomes are always of kind mls: the joiner has no group key yet.
func (g *Group) SetSealed(on bool) { g.sealed = on }

// SetTreeInWelcome says whether Welcomes carry the ratchet tree in their
// GroupInfo's ratchet_tree extension (the default), or leave the joiner to
// get it out of band (RFC 9420 §12.4.3.3), which the fabric refuses.
func (g *Group) SetTreeInWelcome(on bool) { g.noTree = !on }

// EventKey returns the group event key of the current epoch,
// MLS-Exporter("fabric", "group-event", 32).
func (g *Group) EventKey() [binding.KeySize]byte { return g.keys[len(g.keys)-1].key }

// EventKeys returns the group event keys the member retains, oldest first:
// the candidate keys for peeling.
func (g *Group) EventKeys() [][binding.KeySize]byte {
	out := make([][binding.KeySize]byte, len(g.keys))
	for i, k := range g.keys {
		out[i] = k.key
	}
	return out
}

// Member is one leaf of the group.
type Member struct {
	Leaf            uint32
	InboxID         string
	InstallationKey []byte
}

// Members returns the group's leaves in leaf order.
func (g *Group) Members() []Member {
	var out []Member
	for _, m := range g.state.GetMembers() {
		if m == nil || m.Credential == nil {
			continue
		}
		out = append(out, Member{
			Leaf:            uint32(m.LeafIndex),
			InboxID:         hex.EncodeToString(m.Credential.Identity),
			InstallationKey: g.state.MemberSigningKey(m.LeafIndex),
		})
	}
	slices.SortFunc(out, func(a, b Member) int { return cmp.Compare(a.Leaf, b.Leaf) })
	return out
}

// Components returns the components extension of the current epoch.
func (g *Group) Components() (components.Set, error) {
	s, _, err := components.FromExtensions(g.state.GroupContext().Extensions)
	return s, err
}

func (g *Group) recordKey() error {
	key, err := binding.GroupEventKey(g.state)
	if err != nil {
		return fmt.Errorf("testpeer %s: %w", g.peer.name, err)
	}
	g.keys = append(g.keys, epochKey{epoch: g.Epoch(), key: key})
	g.leaveRef = nil // a new epoch drops every pending proposal
	if len(g.keys) > retainedKeys {
		g.keys = append([]epochKey{}, g.keys[len(g.keys)-retainedKeys:]...)
	}
	return nil
}

// emit wraps MLS bytes sent in epoch into a transport message.
func (g *Group) emit(mls []byte, epoch uint64, sealable bool) (Message, error) {
	id := sha256.Sum256(mls)
	m := Message{MLS: mls, ID: id[:], Epoch: epoch}
	m.Transport = schema.TransportMessage{V: schema.TransportVersion, Group: g.ID(), Kind: schema.TransportMLS, Payload: mls}
	if g.sealed && sealable {
		var key *[binding.KeySize]byte
		for i := range g.keys {
			if g.keys[i].epoch == epoch {
				key = &g.keys[i].key
			}
		}
		if key == nil {
			return Message{}, fmt.Errorf("testpeer %s: no group event key for the sending epoch", g.peer.name)
		}
		sealed, err := binding.Seal(*key, mls, rand.Reader)
		if err != nil {
			return Message{}, fmt.Errorf("testpeer %s: %w", g.peer.name, err)
		}
		m.Transport.Kind, m.Transport.Payload = schema.TransportSealed, sealed
	}
	g.own[string(m.ID)] = true
	return m, nil
}

// Invite adds the members of the given KeyPackages (MLSMessage or bare
// KeyPackage bytes) in one commit, and returns the commit and the Welcome for
// the new members. The Welcome's GroupInfo carries the ratchet tree.
func (g *Group) Invite(keyPackages ...[]byte) (commit, welcome Message, err error) {
	if len(keyPackages) == 0 {
		return Message{}, Message{}, fmt.Errorf("testpeer %s: invite: no key packages", g.peer.name)
	}
	for _, b := range keyPackages {
		kp, err := parseKeyPackage(b)
		if err != nil {
			g.state.ClearProposals()
			return Message{}, Message{}, fmt.Errorf("testpeer %s: invite: %w", g.peer.name, err)
		}
		if _, err := g.state.AddMember(kp); err != nil {
			g.state.ClearProposals()
			return Message{}, Message{}, fmt.Errorf("testpeer %s: invite: %w", g.peer.name, err)
		}
	}
	commit, staged, err := g.commit()
	if err != nil {
		return Message{}, Message{}, err
	}
	var added []*keypackages.KeyPackage
	for _, p := range staged.Proposals() {
		if p.Type == group.ProposalTypeAdd && p.Add != nil {
			added = append(added, p.Add.KeyPackage)
		}
	}
	w, err := g.state.CreateWelcomeWithOpts(added, g.peer.sig,
		group.WithJoinerSecret(staged.JoinerSecret()),
		group.WithPSKIDs(staged.PskIDs()),
		group.WithPSKSecret(staged.RawPskSecret()),
		group.WithStagedCommit(staged),
		group.WithGroupInfoOptions(group.WithRatchetTree(!g.noTree)),
	)
	if err != nil {
		return Message{}, Message{}, fmt.Errorf("testpeer %s: welcome: %w", g.peer.name, err)
	}
	welcome, err = g.emit((&framing.MLSMessage{Welcome: w.Marshal()}).Marshal(), g.Epoch(), false)
	return commit, welcome, err
}

// Add invites the peers with fresh KeyPackages of theirs and has each join
// from the Welcome. It returns the commit, which the other members of the
// group must process, and the new members' groups in the order given.
func (g *Group) Add(peers ...*Peer) (Message, []*Group, error) {
	kps := make([][]byte, len(peers))
	for i, p := range peers {
		kp, err := p.KeyPackage()
		if err != nil {
			return Message{}, nil, err
		}
		kps[i] = kp
	}
	commit, welcome, err := g.Invite(kps...)
	if err != nil {
		return Message{}, nil, err
	}
	joined := make([]*Group, len(peers))
	for i, p := range peers {
		if joined[i], err = p.Join(welcome.Transport); err != nil {
			return Message{}, nil, err
		}
	}
	return commit, joined, nil
}

// Remove commits the removal of every leaf of the given inboxes.
func (g *Group) Remove(inboxIDs ...string) (Message, error) {
	var leaves []uint32
	for _, m := range g.Members() {
		for _, id := range inboxIDs {
			if m.InboxID == id {
				leaves = append(leaves, m.Leaf)
			}
		}
	}
	if len(leaves) == 0 {
		return Message{}, fmt.Errorf("testpeer %s: remove: no such member", g.peer.name)
	}
	return g.RemoveLeaves(leaves...)
}

// RemoveLeaves commits the removal of the given leaves.
func (g *Group) RemoveLeaves(leaves ...uint32) (Message, error) {
	for _, l := range leaves {
		if _, err := g.state.RemoveMember(group.LeafNodeIndex(l)); err != nil {
			g.state.ClearProposals()
			return Message{}, fmt.Errorf("testpeer %s: remove: %w", g.peer.name, err)
		}
	}
	m, _, err := g.commit()
	return m, err
}

// Leave returns a leave request: a Remove proposal of the member's own
// leaf, as a PublicMessage, for another member to commit (DESIGN section 2).
// Until that commit arrives the member cannot send.
func (g *Group) Leave() (Message, error) {
	if g.removed {
		return Message{}, ErrRemoved
	}
	p, err := g.state.RemoveMember(g.state.OwnLeafIndex())
	if err != nil {
		return Message{}, fmt.Errorf("testpeer %s: leave: %w", g.peer.name, err)
	}
	b, err := g.state.SignProposalAsPublicMessage(p, g.peer.sig)
	if err != nil {
		return Message{}, fmt.Errorf("testpeer %s: leave: %w", g.peer.name, err)
	}
	m, err := framing.UnmarshalMLSMessage(b)
	if err != nil {
		return Message{}, fmt.Errorf("testpeer %s: leave: %w", g.peer.name, err)
	}
	pm, ok := m.AsPublic()
	if !ok {
		return Message{}, fmt.Errorf("testpeer %s: leave: proposal is not a PublicMessage", g.peer.name)
	}
	ac := &framing.AuthenticatedContent{WireFormat: framing.WireFormatPublicMessage, Content: pm.Content, Auth: pm.Auth}
	g.leaveRef = group.ComputeProposalRef(ac.Marshal(), CipherSuite)
	return g.emit(b, g.Epoch(), true)
}

// GroupInfo returns the signed GroupInfo of the member's current epoch as
// MLSMessage bytes (wire format mls_group_info), ratchet tree included.
func (g *Group) GroupInfo() (Message, error) {
	info, err := g.state.GetGroupInfo(g.peer.sig)
	if err != nil {
		return Message{}, fmt.Errorf("testpeer %s: group info: %w", g.peer.name, err)
	}
	b := (&framing.MLSMessage{GroupInfo: info.Marshal()}).Marshal()
	return g.emit(b, g.Epoch(), false)
}

// Commit commits the proposals the member has received (a leave request, for
// instance); with none it is an empty commit that updates the member's path.
func (g *Group) Commit() (Message, error) {
	m, _, err := g.commit()
	return m, err
}

// SetComponents commits a GroupContextExtensions proposal that replaces the
// components extension with set, keeping the other GroupContext extensions.
func (g *Group) SetComponents(set components.Set) (Message, error) {
	ext, err := components.ToExtension(set)
	if err != nil {
		return Message{}, fmt.Errorf("testpeer %s: set components: %w", g.peer.name, err)
	}
	exts := []group.Extension{ext}
	for _, e := range g.state.GroupContext().Extensions {
		if uint16(e.Type) != components.ExtensionType {
			exts = append(exts, e)
		}
	}
	g.state.Proposals().AddProposal(group.NewGroupContextExtensionsProposal(exts), g.state.OwnLeafIndex())
	m, _, err := g.commit()
	return m, err
}

// commit commits the pending proposals as a PublicMessage, merges it, and
// returns it sealed (when sealing) under the parent epoch's key.
func (g *Group) commit() (Message, *group.StagedCommit, error) {
	if g.removed {
		g.state.ClearProposals()
		return Message{}, nil, ErrRemoved
	}
	parent := g.Epoch()
	staged, err := g.state.Commit(g.peer.sig, g.peer.sig.PublicKey(), nil)
	if err != nil {
		g.state.ClearProposals()
		return Message{}, nil, fmt.Errorf("testpeer %s: commit: %w", g.peer.name, err)
	}
	ac := staged.AuthenticatedContent()
	b := framing.NewMLSMessagePublic(&framing.PublicMessage{
		Content:       ac.Content,
		Auth:          ac.Auth,
		MembershipTag: staged.MembershipTag(),
	}).Marshal()
	// Merging leaves the joiner secret in staged; Invite needs it for the Welcome.
	if err := g.state.MergeCommit(staged); err != nil {
		return Message{}, nil, fmt.Errorf("testpeer %s: merge commit: %w", g.peer.name, err)
	}
	if err := g.recordKey(); err != nil {
		return Message{}, nil, err
	}
	m, err := g.emit(b, parent, true)
	return m, staged, err
}

// Clone returns an independent copy of the member's state, for a test that
// wants the same member on two branches.
func (g *Group) Clone() (*Group, error) {
	b, err := g.state.MarshalState()
	if err != nil {
		return nil, fmt.Errorf("testpeer %s: clone: %w", g.peer.name, err)
	}
	st, err := group.UnmarshalGroupState(b)
	if err != nil {
		return nil, fmt.Errorf("testpeer %s: clone: %w", g.peer.name, err)
	}
	return &Group{
		peer:     g.peer,
		state:    st,
		sealed:   g.sealed,
		keys:     append([]epochKey{}, g.keys...),
		own:      maps.Clone(g.own),
		branches: map[string]*Group{},
		removed:  g.removed,
		leaveRef: g.leaveRef,
	}, nil
}

// Branch runs each op on its own copy of the member's current state and
// returns what each produced: competing messages from one parent epoch. The
// member itself stays at the parent until Adopt picks a branch; it treats
// every branch's message as its own output.
func (g *Group) Branch(ops ...func(*Group) (Message, error)) ([]Message, error) {
	out := make([]Message, 0, len(ops))
	for i, op := range ops {
		c, err := g.Clone()
		if err != nil {
			return nil, err
		}
		m, err := op(c)
		if err != nil {
			return nil, fmt.Errorf("testpeer %s: branch %d: %w", g.peer.name, i, err)
		}
		g.branches[string(m.ID)] = c
		g.own[string(m.ID)] = true
		out = append(out, m)
	}
	return out, nil
}

// Fork returns n competing empty commits from the current epoch, each with
// a fresh update path, for convergence tests. Adopt picks the one the member
// continues on.
func (g *Group) Fork(n int) ([]Message, error) {
	ops := make([]func(*Group) (Message, error), n)
	for i := range ops {
		ops[i] = (*Group).Commit
	}
	return g.Branch(ops...)
}

// ErrUnknownBranch is returned by Adopt for a message Branch did not make.
var ErrUnknownBranch = errors.New("testpeer: not a branch of this member")

// Adopt moves the member onto the branch that produced m.
func (g *Group) Adopt(m Message) error {
	b, ok := g.branches[string(m.ID)]
	if !ok {
		return ErrUnknownBranch
	}
	own := g.own
	maps.Copy(own, b.own)
	*g = *b
	g.own = own
	g.branches = map[string]*Group{}
	return nil
}

// isOwn reports whether id is a message this member produced.
func (g *Group) isOwn(id []byte) bool { return g.own[string(id)] }
