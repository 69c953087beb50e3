package engine

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	mlsext "github.com/thomas-vilte/mls-go/extensions"
	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"
	"github.com/thomas-vilte/mls-go/secrettree"
	"github.com/thomas-vilte/mls-go/treesync"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// More sentinel causes.
var (
	// ErrNoRatchetTree: the Welcome's GroupInfo has no ratchet_tree extension
	// and no tree was supplied. Its text is what the Welcome's outcome
	// record gives as the reason (docs/interop.md).
	ErrNoRatchetTree = errors.New("the Welcome's GroupInfo has no ratchet_tree extension (RFC 9420 §12.4.3.3) and the fabric has no other copy of the tree")
	// ErrSignature: the sender's signature does not verify.
	ErrSignature = errors.New("signature does not verify")
	// ErrUnauthorized: the committer may not make this change.
	ErrUnauthorized = errors.New("committer not authorized")
	// ErrAdderNotAdmin: the Welcome's signer is not an admin of the group it
	// joins (Marmot joining.md step 8).
	ErrAdderNotAdmin = errors.New("welcome signer is not an admin")
)

// JoinInfo is what a join learned.
type JoinInfo struct {
	GroupID       []byte
	Epoch         uint64
	Adder         Member // the GroupInfo signer's leaf (JOIN-025)
	Components    components.Set
	HasComponents bool
	KeyPackageRef []byte // the consumed KeyPackage; remove it once the group is stored
}

// Join joins a group from a Welcome MLSMessage addressed to one of inst's
// KeyPackages. The ratchet tree comes from the GroupInfo's ratchet_tree
// extension, or from ratchetTree (an RFC 9420 §12.4.3.3 ratchet_tree
// extension body) when the GroupInfo has none. Join is tentative: it changes
// nothing in inst; the caller removes the KeyPackage once it stored the group.
func (inst *Installation) Join(welcomeMessage, ratchetTree []byte, opts ...JoinOption) (st *State, ji *JoinInfo, err error) {
	const op = "join"
	defer recoverDecode(op, &err)
	var cfg joinConfig
	for _, o := range opts {
		o(&cfg)
	}
	c, err := Classify(welcomeMessage)
	if err != nil {
		return nil, nil, err
	}
	if c.WireFormat != WireWelcome {
		return nil, nil, fail(op, schema.CategoryInvalidEncoding, errors.New("not a Welcome"))
	}
	if c.CipherSuite != uint16(inst.suite) {
		return nil, nil, fail(op, schema.CategoryWrongRecipient, ErrCipherSuite)
	}
	welcome, err := group.UnmarshalWelcome(welcomeMessage[4:])
	if err != nil {
		return nil, nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	var entry *keyPackageEntry
	var ref []byte
	for _, s := range welcome.Secrets {
		if e, ok := inst.keyPackages[string(s.NewMember)]; ok {
			entry, ref = e, slices.Clone(s.NewMember)
			break
		}
	}
	if entry == nil {
		return nil, nil, fail(op, schema.CategoryWrongRecipient, ErrNoKeyPackage)
	}
	keys, err := entry.privateKeys(inst.suite)
	if err != nil {
		return nil, nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	// A Welcome one hosted member joined already is not checked again
	// for the others it adds (WelcomeCache).
	var secrets *group.Secrets
	var remembered *joinedWelcome
	if cfg.welcomes != nil && cfg.psks == nil {
		if gs, ok := openSecrets(welcome, ref, keys); ok {
			secrets = gs
			remembered = cfg.welcomes.lookup(welcomeID(welcomeMessage), welcome.CipherSuite, gs.JoinerSecret.AsSlice())
		}
	}
	var g *group.Group
	var signer uint32
	treeInInfo := true
	if remembered != nil {
		g, signer = remembered.join(secrets, entry.kp, keys)
	}
	if g == nil {
		if g, err = group.JoinFromWelcome(welcome, entry.kp, keys, cfg.psks); err != nil {
			return nil, nil, classifyMLSGoError(op, err)
		}
		info := welcome.GroupInfo
		if info == nil || info.GroupContext == nil {
			return nil, nil, fail(op, schema.CategoryInvalidEncoding, errors.New("welcome without group info"))
		}
		signer = uint32(info.Signer)
		if !hasExtension(info.Extensions, mlsext.ExtensionTypeRatchetTree) {
			treeInInfo = false
			if len(ratchetTree) == 0 {
				return nil, nil, fail(op, schema.CategoryInvalidEncoding, ErrNoRatchetTree)
			}
			if g, err = withSuppliedTree(g, info, ratchetTree, entry.kp.LeafNode.EncryptionKey); err != nil {
				return nil, nil, err
			}
		}
	}
	st = &State{g: g}
	set, found, err := st.Components()
	if err != nil {
		return nil, nil, err
	}
	adder, ok := st.Member(signer)
	if !ok {
		return nil, nil, fail(op, schema.CategoryInvalidSignature, errors.New("group info signer is not a member"))
	}
	if found && components.RoleOf(set, accountOf(adder.InboxID)) < components.RoleAdmin {
		return nil, nil, fail(op, schema.CategoryAuthorizationFailed, ErrAdderNotAdmin)
	}
	if secrets != nil && remembered == nil && treeInInfo {
		cfg.welcomes.remember(welcomeID(welcomeMessage), welcome.CipherSuite, secrets.JoinerSecret.AsSlice(), g, signer)
	}
	return st, &JoinInfo{
		GroupID:       st.GroupID(),
		Epoch:         st.Epoch(),
		Adder:         adder,
		Components:    set,
		HasComponents: found,
		KeyPackageRef: ref,
	}, nil
}

// JoinOption configures Join.
type JoinOption func(*joinConfig)

type joinConfig struct {
	psks     map[string][]byte
	welcomes *WelcomeCache
}

// WithExternalPSKs supplies external pre-shared keys by psk_id (RFC 9420
// §8.4) that the Welcome or later commits may name.
func WithExternalPSKs(psks map[string][]byte) JoinOption {
	return func(c *joinConfig) { c.psks = psks }
}

func hasExtension(exts []group.Extension, t mlsext.ExtensionType) bool {
	return slices.ContainsFunc(exts, func(e group.Extension) bool { return e.Type == t })
}

// withSuppliedTree rebuilds a group joined without a ratchet_tree extension
// around a tree supplied out of band. mls-go v1.6.0 cannot take such a tree
// in JoinFromWelcome, so the state is rewritten with the tree and restored;
// restoring verifies the tree against the GroupContext's tree hash, and the
// GroupInfo signature is checked against the signer's leaf here. Path keys
// from the Welcome's path_secret are not derived on this path (Marmot always
// sends the tree in the GroupInfo).
func withSuppliedTree(g *group.Group, info *group.Info, treeBytes, ownEncryptionKey []byte) (*group.Group, error) {
	const op = "join"
	cs := g.CipherSuite()
	tree, err := treesync.UnmarshalTreeFromExtension(treeBytes, cs)
	if err != nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	tree = tree.ExpandToPowerOf2()
	signer := tree.GetLeaf(treesync.LeafIndex(info.Signer))
	if signer == nil || signer.LeafData == nil {
		return nil, fail(op, schema.CategoryInvalidSignature, errors.New("group info signer leaf missing"))
	}
	pub := ciphersuite.NewMLSSignaturePublicKey(signer.LeafData.SigKeyBytes(), cs.SignatureScheme())
	if err := ciphersuite.VerifyWithLabel(pub, "GroupInfoTBS", info.MarshalTBS(), ciphersuite.NewSignature(info.Signature)); err != nil {
		return nil, fail(op, schema.CategoryInvalidSignature, ErrSignature)
	}
	raw, err := g.MarshalState()
	if err != nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	defer clear(raw)
	var sd group.StateData
	if err := json.Unmarshal(raw, &sd); err != nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	own, found := uint32(0), false
	sd.Members = make(map[uint32]*group.MemberStateData)
	for i := range tree.NumLeaves {
		leaf := tree.GetLeaf(treesync.LeafIndex(i))
		if leaf == nil || leaf.State != treesync.NodeStatePresent || leaf.LeafData == nil {
			continue
		}
		m := &group.MemberStateData{LeafIndex: i, Active: true, SigningKey: slices.Clone(leaf.LeafData.SigKeyBytes())}
		if leaf.LeafData.Credential != nil {
			m.Credential = leaf.LeafData.Credential.Marshal()
		}
		sd.Members[i] = m
		if !found && bytes.Equal(leaf.LeafData.EncryptionKey, ownEncryptionKey) {
			own, found = i, true
		}
	}
	if !found {
		return nil, fail(op, schema.CategoryInvalidEncoding, errors.New("own leaf not in supplied tree"))
	}
	sd.OwnLeafIndex = own
	sd.RatchetTree = tree.MarshalTree()
	sd.SecretTree = nil // rebuilt from the encryption secret for the real leaf count
	sd.PathNodePrivKeys = nil
	fixed, err := json.Marshal(&sd)
	if err != nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	defer clear(fixed)
	ng, err := group.UnmarshalGroupState(fixed)
	if err != nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	return ng, nil
}

// HandshakeResult is what processing a proposal or commit changed.
type HandshakeResult struct {
	Class     schema.InputClass // ClassProposal or ClassCommit
	MessageID MessageID         // for a commit, its commit_digest
	Sender    Member            // the proposal's sender or the committer
	// ProposalRef is a proposal's RFC 9420 §5.2 ProposalRef, by which commits
	// name it; for a commit, ProposalRefs lists the proposals it consumed by
	// reference, so their dispositions can follow the commit's.
	ProposalRef  []byte
	ProposalRefs [][]byte
	// Commit only:
	Privileged        bool     // needed an admin in the parent (convergence order)
	AddedInboxes      []string // inboxes member after and not before, sorted
	RemovedInboxes    []string // inboxes member before and not after, sorted
	AddedLeaves       []Member
	RemovedLeaves     []Member
	RemovedSelf       bool     // the hosted member's own leaf was removed
	ChangedComponents []string // EVENT-019 names
	Components        components.Set
}

// ProcessHandshake applies a PublicMessage proposal or commit to a copy of s
// and returns the copy: s itself is untouched, so a commit can be tried
// against any retained parent. A commit is authorized against s's components
// (privileged changes need an admin); an unauthorized commit fails with
// category authorization_failed. A member's message whose membership tag
// does not verify under s fails with ErrNotAuthenticated (missing_history:
// s is not its parent, see [State.Authenticates]); once the tag verifies, a
// failed sender signature is invalid_signature (ErrSignature), terminal for
// the message. A commit that removes the hosted member's
// own leaf returns a nil State and a result with RemovedSelf set: the copy
// is inactive from then on (Marmot member-departure.md).
func (s *State) ProcessHandshake(mlsMessage []byte) (next *State, res *HandshakeResult, err error) {
	return s.processHandshake(mlsMessage, nil)
}

// processHandshake is ProcessHandshake; with as set, the copy is made for
// that member of s's group instead of s's own ([State.ProcessAs]).
func (s *State) processHandshake(mlsMessage []byte, as *MemberKeys) (next *State, res *HandshakeResult, err error) {
	const op = "process handshake"
	defer recoverDecode(op, &err)
	own := s.OwnLeaf()
	if as != nil {
		own = as.Leaf
	}
	c, pm, err := parsePublicHandshake(op, mlsMessage)
	if err != nil {
		return nil, nil, err
	}
	if err := s.checkGroup(op, c); err != nil {
		return nil, nil, err
	}
	if err := s.checkEpoch(op, c); err != nil {
		return nil, nil, err
	}
	// The membership tag first: it tells whether this state is the parent at
	// all. Only then is a failed signature the sender's fault (inbound
	// processing: terminal once MLS authentication identifies the parent).
	if pm.Content.Sender.Type == framing.SenderTypeMember && !s.membershipTagVerifies(pm) {
		return nil, nil, fail(op, schema.CategoryMissingHistory, ErrNotAuthenticated)
	}
	if err := s.g.VerifyPublicMessage(pm); err != nil {
		return nil, nil, fail(op, schema.CategoryInvalidSignature, errors.Join(ErrSignature, err))
	}
	res = &HandshakeResult{Class: c.Class, MessageID: NewMessageID(mlsMessage)}
	if pm.Content.Sender.Type == framing.SenderTypeMember {
		res.Sender, _ = s.Member(pm.Content.Sender.LeafIndex)
	}
	var ops []components.Op
	var shape commitShape
	if c.Class == schema.ClassCommit {
		if ops, shape, err = s.commitOps(pm, res.Sender); err != nil {
			return nil, nil, err
		}
		res.ProposalRefs = shape.refs
		if slices.Contains(shape.removed, own) {
			return s.ownRemoval(ops, shape, res)
		}
	}
	if c.Class == schema.ClassCommit && pm.Content.Sender.Type == framing.SenderTypeMember && res.Sender.Leaf == own {
		// An own commit: mls-go cannot process it, the state after it
		// was kept when it was made (State.Commit).
		if next, err = s.ownCommit(res.MessageID); err != nil {
			return nil, nil, err
		}
	}
	if next == nil {
		if as != nil {
			next, err = s.As(as)
		} else {
			next, err = s.Clone()
		}
		if err != nil {
			return nil, nil, err
		}
		if err := next.g.ProcessPublicMessage(pm); err != nil {
			return nil, nil, classifyMLSGoError(op, err)
		}
	}
	if c.Class == schema.ClassProposal {
		res.ProposalRef = proposalRefOf(pm, s.g.CipherSuite())
		return next, res, nil
	}
	next.pending, next.sent = nil, nil // a new epoch
	if err := s.authorizeCommit(op, next, ops, res); err != nil {
		return nil, nil, err
	}
	return next, res, nil
}

// commitShape is what a commit's proposals do to membership and extensions.
type commitShape struct {
	removed    []uint32          // leaves of Remove proposals
	added      []string          // inbox ids of Add proposals
	extensions []group.Extension // the last GroupContextExtensions proposal's, if any
	hasGCE     bool
	refs       [][]byte // ProposalRefs of by-reference proposals
}

// ownRemoval handles a commit that removes the hosted member's own leaf.
// mls-go cannot process it (the removed leaf cannot decrypt the new path),
// and the hosted copy becomes inactive anyway (Marmot member-departure.md):
// the commit is authenticated (done by the caller) and authorized against s,
// and the result carries no new state.
func (s *State) ownRemoval(ops []components.Op, shape commitShape, res *HandshakeResult) (*State, *HandshakeResult, error) {
	parentSet, _, err := s.Components()
	if err != nil {
		return nil, nil, err
	}
	nextSet := parentSet
	if shape.hasGCE {
		if nextSet, _, err = components.FromExtensions(shape.extensions); err != nil {
			return nil, nil, fail("process handshake", schema.CategoryInvalidEncoding, err)
		}
	}
	if err := components.Authorize(parentSet, nextSet, accountOf(res.Sender.InboxID), ops); err != nil {
		return nil, nil, fail("process handshake", schema.CategoryAuthorizationFailed, ErrUnauthorized)
	}
	res.Privileged = components.Privileged(parentSet, nextSet, ops)
	res.Components = nextSet
	res.ChangedComponents = components.Diff(parentSet, nextSet)
	res.RemovedSelf = true
	remaining := make(map[string]bool)
	for _, m := range s.Members() {
		if slices.Contains(shape.removed, m.Leaf) {
			res.RemovedLeaves = append(res.RemovedLeaves, m)
		} else {
			remaining[m.InboxID] = true
		}
	}
	before := s.InboxIDs()
	for _, id := range before {
		if !remaining[id] {
			res.RemovedInboxes = append(res.RemovedInboxes, id)
		}
	}
	for _, id := range shape.added {
		if _, found := slices.BinarySearch(before, id); !found && !slices.Contains(res.AddedInboxes, id) {
			res.AddedInboxes = append(res.AddedInboxes, id)
		}
	}
	slices.Sort(res.AddedInboxes)
	return nil, res, nil
}

// commitOps lists a commit's proposals for authorization, resolving
// by-reference proposals against the proposals s has stored.
func (s *State) commitOps(pm *framing.PublicMessage, committer Member) ([]components.Op, commitShape, error) {
	var shape commitShape
	commit, err := commitOf("process handshake", pm)
	if err != nil {
		return nil, shape, err
	}
	stored := s.g.StoredProposals()
	var ops []components.Op
	for _, por := range commit.Proposals {
		p, sender := por.Proposal, committer
		if p == nil {
			shape.refs = append(shape.refs, slices.Clone(por.ProposalRef))
			i := slices.IndexFunc(stored, func(sp group.StoredProposal) bool { return bytes.Equal(sp.Ref, por.ProposalRef) })
			if i < 0 {
				// mls-go rejects the commit for the unknown reference.
				continue
			}
			p = stored[i].Proposal
			sender, _ = s.Member(uint32(stored[i].Sender))
		}
		op := components.Op{Proposer: accountOf(sender.InboxID)}
		switch p.Type {
		case group.ProposalTypeAdd:
			op.Type = components.OpAdd
			if p.Add != nil && p.Add.KeyPackage != nil && p.Add.KeyPackage.LeafNode != nil && p.Add.KeyPackage.LeafNode.Credential != nil {
				shape.added = append(shape.added, hex.EncodeToString(p.Add.KeyPackage.LeafNode.Credential.Identity))
			}
		case group.ProposalTypeUpdate:
			op.Type = components.OpUpdate
		case group.ProposalTypeRemove:
			op.Type = components.OpRemove
			if p.Remove != nil {
				shape.removed = append(shape.removed, uint32(p.Remove.Removed))
				target, _ := s.Member(uint32(p.Remove.Removed))
				op.Target = accountOf(target.InboxID)
				op.SelfTarget = sender.InboxID != "" && target.Leaf == sender.Leaf && bytes.Equal(target.InstallationKey, sender.InstallationKey)
			}
		case group.ProposalTypeGroupContextExtensions:
			op.Type = components.OpOtherExtensions
			if p.GroupContextExtensions != nil {
				shape.extensions, shape.hasGCE = p.GroupContextExtensions.Extensions, true
			}
			if p.GroupContextExtensions != nil && onlyComponentsDiffer(s.g.GroupContext().Extensions, p.GroupContextExtensions.Extensions) {
				op.Type = components.OpComponents
			}
		case group.ProposalTypePreSharedKey:
			op.Type = components.OpPSK
		case group.ProposalTypeReInit:
			op.Type = components.OpReInit
		default:
			op.Type = components.OpExternalInit
		}
		ops = append(ops, op)
	}
	return ops, shape, nil
}

// onlyComponentsDiffer reports whether two extension lists differ at most in
// the components extension.
func onlyComponentsDiffer(a, b []group.Extension) bool {
	strip := func(exts []group.Extension) map[mlsext.ExtensionType][]byte {
		m := make(map[mlsext.ExtensionType][]byte)
		for _, e := range exts {
			if uint16(e.Type) != components.ExtensionType {
				m[e.Type] = e.Data
			}
		}
		return m
	}
	x, y := strip(a), strip(b)
	if len(x) != len(y) {
		return false
	}
	for t, d := range x {
		if e, ok := y[t]; !ok || !bytes.Equal(d, e) {
			return false
		}
	}
	return true
}

// membershipDiff fills the membership changes between s and next.
func (s *State) membershipDiff(next *State, res *HandshakeResult) {
	before, after := s.Members(), next.Members()
	key := func(m Member) string { return m.InboxID + "/" + hex.EncodeToString(m.InstallationKey) }
	in := func(list []Member, m Member) bool {
		return slices.ContainsFunc(list, func(o Member) bool { return o.Leaf == m.Leaf && key(o) == key(m) })
	}
	for _, m := range after {
		if !in(before, m) {
			res.AddedLeaves = append(res.AddedLeaves, m)
		}
	}
	for _, m := range before {
		if !in(after, m) {
			res.RemovedLeaves = append(res.RemovedLeaves, m)
			if m.Leaf == next.OwnLeaf() {
				res.RemovedSelf = true
			}
		}
	}
	bi, ai := s.InboxIDs(), next.InboxIDs()
	for _, id := range ai {
		if _, found := slices.BinarySearch(bi, id); !found {
			res.AddedInboxes = append(res.AddedInboxes, id)
		}
	}
	for _, id := range bi {
		if _, found := slices.BinarySearch(ai, id); !found {
			res.RemovedInboxes = append(res.RemovedInboxes, id)
		}
	}
}

// Application is a decrypted application message.
type Application struct {
	MessageID MessageID
	Epoch     uint64
	Sender    Member
	// Generation is the message's place in its sender's application
	// ratchet of the epoch (RFC 9420 §9): the sender's send order.
	Generation uint32
	Payload    []byte // the app payload (internal/apppayload decodes it)
	AAD        []byte // authenticated_data
}

// classifyApplication classifies an input that must be an application
// PrivateMessage, refusing any other.
func classifyApplication(op string, mlsMessage []byte) (Classification, error) {
	c, err := Classify(mlsMessage)
	if err != nil {
		return c, err
	}
	if c.WireFormat != WirePrivateMessage || c.Class != schema.ClassApplication {
		return c, fail(op, schema.CategoryUnsupportedRequiredFeature, ErrNotApplication)
	}
	return c, nil
}

// parsePrivate decodes a classified application PrivateMessage.
func parsePrivate(op string, mlsMessage []byte) (*framing.PrivateMessage, error) {
	msg, err := framing.UnmarshalMLSMessage(mlsMessage)
	if err != nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	pm, ok := msg.AsPrivate()
	if !ok {
		return nil, fail(op, schema.CategoryInvalidEncoding, ErrNotApplication)
	}
	return pm, nil
}

// Decrypt decrypts an application PrivateMessage of this epoch (RFC 9420
// §6.3) and checks its sender's signature, as mls-go's
// group.ReceiveApplicationMessage does, but through s's signature cache
// when it has one ([State.ShareSignatures]). It advances the sender's
// ratchet in place (RFC 9420 §9: each key is used once), so decrypting the
// same message twice fails; snapshot s afterwards.
func (s *State) Decrypt(mlsMessage []byte) (app *Application, err error) {
	const op = "decrypt"
	defer recoverDecode(op, &err)
	c, err := classifyApplication(op, mlsMessage)
	if err != nil {
		return nil, err
	}
	if err := s.checkGroup(op, c); err != nil {
		return nil, err
	}
	if err := s.checkEpoch(op, c); err != nil {
		return nil, err
	}
	if s.isSent(c.MessageID) {
		return nil, fail(op, schema.CategoryOwnEcho, ErrOwnEcho)
	}
	pm, err := parsePrivate(op, mlsMessage)
	if err != nil {
		return nil, err
	}
	if s.g.State() != group.StateOperational {
		return nil, classifyMLSGoError(op, group.ErrGroupNotOperational)
	}
	secrets, tree := s.g.EpochSecrets(), s.g.SecretTree()
	if secrets == nil || secrets.SenderDataSecret == nil || tree == nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, errors.New("epoch secrets missing"))
	}
	s.changes++ // the ratchet may advance even when decryption then fails
	s.ratchets++
	app, err = openApplication(op, c, pm, epochKeys{
		suite:      s.g.CipherSuite(),
		senderData: secrets.SenderDataSecret,
		tree:       tree,
		context:    s.g.GroupContext().Marshal(),
		sigs:       s.sigs,
		sender: func(leaf uint32) (Member, []byte, error) {
			node := s.g.GetTreeLeaf(group.LeafNodeIndex(leaf))
			switch {
			case node == nil:
				return Member{}, nil, classifyMLSGoError(op, &group.ErrUnknownMember{LeafIndex: leaf})
			case node.State != treesync.NodeStatePresent || node.LeafData == nil:
				return Member{}, nil, classifyMLSGoError(op, group.ErrSenderNotActive)
			}
			m, ok := s.Member(leaf)
			if !ok {
				return Member{}, nil, fail(op, schema.CategoryInvalidSignature, errors.New("sender leaf is blank"))
			}
			return m, node.LeafData.SigKeyBytes(), nil
		},
	})
	if err != nil {
		return nil, err
	}
	return app, nil
}

// epochKeys is what opening an application message of one epoch needs:
// the message protection secrets (RFC 9420 §6.3, §9) and the senders'
// signature keys.
type epochKeys struct {
	suite      ciphersuite.CipherSuite
	senderData *ciphersuite.Secret
	tree       *secrettree.Tree
	context    []byte // the GroupContext, signed over (FramedContentTBS)
	sigs       *SignatureCache
	// sender returns the member at a leaf and its signature key.
	sender func(leaf uint32) (Member, []byte, error)
}

// openApplication decrypts pm under k and checks its sender's signature.
func openApplication(op string, c Classification, pm *framing.PrivateMessage, k epochKeys) (*Application, error) {
	gen, err := senderGeneration(pm, k.senderData, k.suite)
	if err != nil {
		return nil, classifyMLSGoError(op, &group.ErrDecryptionFailed{Reason: "sender data", Err: err})
	}
	ac, err := framing.Decrypt(pm, framing.DecryptParams{
		CipherSuite:      k.suite,
		SenderDataSecret: k.senderData,
		SecretTree:       k.tree,
		GroupContext:     k.context,
	})
	if err != nil {
		return nil, classifyMLSGoError(op, &group.ErrDecryptionFailed{Reason: "message", Err: err})
	}
	sender, key, err := k.sender(ac.Content.Sender.LeafIndex)
	if err != nil {
		return nil, err
	}
	if len(key) == 0 {
		return nil, classifyMLSGoError(op, group.ErrMissingSenderSignature)
	}
	if err := k.sigs.verify(k.suite.SignatureScheme(), key, ac.MarshalTBS(), ac.Auth.Signature); err != nil {
		return nil, classifyMLSGoError(op, &group.ErrInvalidSignature{Context: "private message", Err: err})
	}
	data, ok := ac.Content.ApplicationData()
	if !ok {
		return nil, classifyMLSGoError(op, group.ErrNotApplicationData)
	}
	return &Application{MessageID: c.MessageID, Epoch: c.Epoch, Sender: sender, Generation: gen, Payload: data, AAD: ac.Content.AuthenticatedData}, nil
}

// senderGeneration opens a PrivateMessage's sender data (RFC 9420 §6.3.2)
// for its generation, which framing.Decrypt does not return.
func senderGeneration(pm *framing.PrivateMessage, secret *ciphersuite.Secret, cs ciphersuite.CipherSuite) (uint32, error) {
	sample := pm.Ciphertext
	if n := cs.HashLength(); len(sample) > n {
		sample = sample[:n]
	}
	key, err := secret.KdfExpandLabel("key", sample, cs.AEADKeyLength())
	if err != nil {
		return 0, err
	}
	defer key.SecureZero()
	nonce, err := secret.KdfExpandLabel("nonce", sample, cs.AEADNonceLength())
	if err != nil {
		return 0, err
	}
	defer nonce.SecureZero()
	// SenderDataAAD: group_id<V>, epoch, content_type.
	aad := appendVarint(nil, uint64(len(pm.GroupID)))
	aad = append(aad, pm.GroupID...)
	aad = binary.BigEndian.AppendUint64(aad, pm.Epoch)
	aad = append(aad, byte(pm.ContentType))
	plain, err := ciphersuite.DecryptWithCipherSuite(key.AsSlice(), nonce.AsSlice(), pm.EncryptedSenderData, aad, cs)
	if err != nil {
		return 0, err
	}
	sd, err := framing.UnmarshalSenderData(plain)
	if err != nil {
		return 0, err
	}
	return sd.Generation, nil
}

// appendVarint appends an RFC 9420 §2.1.2 variable-length integer.
func appendVarint(b []byte, n uint64) []byte {
	switch {
	case n < 1<<6:
		return append(b, byte(n))
	case n < 1<<14:
		return binary.BigEndian.AppendUint16(b, uint16(n)|0x4000)
	default:
		return binary.BigEndian.AppendUint32(b, uint32(n)|0x80000000)
	}
}
