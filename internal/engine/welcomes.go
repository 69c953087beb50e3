package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"maps"
	"sync"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	mlsext "github.com/thomas-vilte/mls-go/extensions"
	"github.com/thomas-vilte/mls-go/group"
	"github.com/thomas-vilte/mls-go/keypackages"
	"github.com/thomas-vilte/mls-go/treesync"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// DefaultWelcomeCacheSize is how many Welcomes a WelcomeCache made with
// NewWelcomeCache(0) remembers.
const DefaultWelcomeCacheSize = 4

// WelcomeCache remembers, for the Welcomes this process joined last, the
// state the first joiner reached, so the other hosted members one Welcome
// adds join without checking its GroupInfo and ratchet tree again. A full
// join verifies every leaf's signature (RFC 9420 §12.4.3.1), so n hosted
// members of an n-member group cost n² verifications; with the cache they
// cost n.
//
// Everything a join learns from a Welcome but the joiner's own leaf, leaf
// key and path keys comes from the GroupInfo, which the Welcome encrypts
// once under a key derived from the joiner_secret: a joiner whose
// GroupSecrets carry the same joiner_secret (and no PSKs) decrypts the same
// GroupInfo bytes, so every check of it passed for it too. Such a joiner
// gets the remembered state with its own leaf index, leaf private key and
// the path keys of its path_secret, exactly what mls-go's JoinFromWelcome
// gives it (TestWelcomeCacheJoinsAsFullJoin); any other joiner is joined
// in full. It is safe for concurrent use. The entries hold epoch secrets,
// like the member states made from them.
type WelcomeCache struct {
	mu      sync.Mutex
	max     int
	entries []*joinedWelcome // oldest first
}

// NewWelcomeCache returns a cache of up to n Welcomes
// (DefaultWelcomeCacheSize when n is 0).
func NewWelcomeCache(n int) *WelcomeCache {
	if n <= 0 {
		n = DefaultWelcomeCacheSize
	}
	return &WelcomeCache{max: n}
}

// joinedWelcome is one remembered join. It is not changed once made.
type joinedWelcome struct {
	id     [32]byte // SHA-256 of the Welcome message
	suite  ciphersuite.CipherSuite
	joiner []byte // the joiner_secret
	// base is the joined state with no joiner's own fields.
	base group.StateData
	// leaves maps a leaf's encryption key to its index (the first leaf
	// holding it, as JoinFromWelcome searches).
	leaves map[string]uint32
	// path are the present nodes of the GroupInfo signer's direct path
	// above its leaf: a path_secret's keys, from the first node above the
	// joiner (RFC 9420 §12.4.3.1).
	path   []treesync.NodeIndex
	tree   *treesync.RatchetTree
	signer uint32 // the GroupInfo signer's leaf
	// psks are the cached PSKs, which base cannot carry: their map keys
	// are raw bytes, which JSON does not keep (snapshotEnvelope).
	psks map[string][]byte
}

// WithWelcomeCache makes Join remember the Welcome in c and join from it
// without checking it again when c remembers it already.
func WithWelcomeCache(c *WelcomeCache) JoinOption {
	return func(cfg *joinConfig) { cfg.welcomes = c }
}

// openSecrets decrypts the GroupSecrets the Welcome addresses to ref.
func openSecrets(w *group.Welcome, ref []byte, keys *keypackages.KeyPackagePrivateKeys) (*group.Secrets, bool) {
	for i := range w.Secrets {
		if !bytes.Equal(w.Secrets[i].NewMember, ref) {
			continue
		}
		data, err := ciphersuite.DecryptWithLabel(keys.InitKey.Bytes(), "Welcome", w.EncryptedGroupInfo, &w.Secrets[i].EncryptedGroupSecrets, w.CipherSuite)
		if err != nil {
			return nil, false
		}
		gs, err := group.UnmarshalGroupSecrets(data)
		clear(data)
		if err != nil || len(gs.Psks) > 0 {
			return nil, false
		}
		return gs, true
	}
	return nil, false
}

// lookup returns the entry of a Welcome whose joiner_secret is joiner.
func (c *WelcomeCache) lookup(id [32]byte, suite ciphersuite.CipherSuite, joiner []byte) *joinedWelcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.id == id && e.suite == suite && bytes.Equal(e.joiner, joiner) {
			return e
		}
	}
	return nil
}

// remember keeps what a full join of a Welcome reached.
func (c *WelcomeCache) remember(id [32]byte, suite ciphersuite.CipherSuite, joiner []byte, g *group.Group, signer uint32) {
	if c.lookup(id, suite, joiner) != nil {
		return
	}
	raw, err := g.MarshalState()
	if err != nil {
		return
	}
	defer clear(raw)
	e := &joinedWelcome{id: id, suite: suite, joiner: bytes.Clone(joiner), leaves: make(map[string]uint32), signer: signer}
	if err := json.Unmarshal(raw, &e.base); err != nil {
		return
	}
	e.base.OwnLeafIndex, e.base.MyLeafEncryptionKey, e.base.PathNodePrivKeys, e.base.PendingUpdatePrivKey = 0, nil, nil, nil
	e.base.CachedPsks, e.psks = nil, maps.Clone(g.CachedPsks())
	if e.tree, err = treesync.UnmarshalTree(e.base.RatchetTree, suite); err != nil {
		return
	}
	for i := range e.tree.NumLeaves {
		leaf := e.tree.GetLeaf(treesync.LeafIndex(i))
		if leaf == nil || leaf.LeafData == nil {
			continue
		}
		if _, dup := e.leaves[string(leaf.LeafData.EncryptionKey)]; !dup {
			e.leaves[string(leaf.LeafData.EncryptionKey)] = i
		}
	}
	if dp := e.tree.DirectPath(treesync.LeafIndex(signer)); len(dp) > 0 {
		for _, n := range dp[1:] {
			if int(n) >= len(e.tree.Nodes) {
				break
			}
			if e.tree.Nodes[n].State == treesync.NodeStatePresent {
				e.path = append(e.path, n)
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = append(c.entries, e)
	if len(c.entries) > c.max {
		c.entries[0] = nil
		c.entries = c.entries[1:]
	}
}

// join makes the state JoinFromWelcome would make for the joiner of kp
// from a remembered join, and returns the GroupInfo signer's leaf; nil
// when it cannot.
func (e *joinedWelcome) join(gs *group.Secrets, kp *keypackages.KeyPackage, keys *keypackages.KeyPackagePrivateKeys) (*group.Group, uint32) {
	mk, ok := e.memberKeys(gs, kp, keys)
	if !ok {
		return nil, 0
	}
	sd := e.base
	sd.OwnLeafIndex = mk.Leaf
	sd.MyLeafEncryptionKey = mk.LeafKey
	if len(mk.Path) > 0 {
		sd.PathNodePrivKeys = make(map[treesync.NodeIndex][]byte, len(mk.Path))
		for n, v := range mk.Path {
			sd.PathNodePrivKeys[treesync.NodeIndex(n)] = v
		}
	}
	raw, err := json.Marshal(&sd)
	if err != nil {
		return nil, 0
	}
	defer clear(raw)
	g, err := group.UnmarshalGroupState(raw)
	if err != nil {
		return nil, 0
	}
	for k, v := range e.psks {
		g.LoadPsk([]byte(k), bytes.Clone(v))
	}
	return g, e.signer
}

// memberKeys returns the joiner's own leaf, leaf key and the path keys of
// its path_secret (RFC 9420 §12.4.3.1); false when kp's leaf is not in
// the remembered tree.
func (e *joinedWelcome) memberKeys(gs *group.Secrets, kp *keypackages.KeyPackage, keys *keypackages.KeyPackagePrivateKeys) (*MemberKeys, bool) {
	encKey := kp.LeafNode.EncryptionKey
	if len(encKey) == 0 {
		encKey = kp.InitKey
	}
	own, ok := e.leaves[string(encKey)]
	if !ok {
		return nil, false
	}
	mk := &MemberKeys{Leaf: own, Path: make(map[uint32][]byte)}
	if keys.EncryptionKey != nil {
		mk.LeafKey = keys.EncryptionKey.Bytes()
	} else {
		mk.LeafKey = keys.InitKey.Bytes()
	}
	if len(gs.PathSecret) == 0 {
		return mk, true
	}
	ps := ciphersuite.NewSecretForCS(e.suite, gs.PathSecret)
	started := false
	for _, n := range e.path {
		if !started {
			if !subtreeHolds(n, own) {
				continue
			}
			started = true
		}
		node, err := ps.DeriveSecret(e.suite, "node")
		if err == nil {
			if priv, err := ciphersuite.DeriveKeyPair(e.suite, node.AsSlice()); err == nil {
				mk.Path[uint32(n)] = priv.Bytes()
			}
		}
		if ps, err = ps.DeriveSecret(e.suite, "path"); err != nil {
			return nil, false
		}
	}
	return mk, true
}

// subtreeHolds reports whether leaf is under node n, in the array layout
// of RFC 9420 Appendix C: a node of level k spans the node indices within
// 2^k - 1 of its own (treesync's SubtreeContainsLeaf walks the subtree,
// O(N) at the root).
func subtreeHolds(n treesync.NodeIndex, leaf uint32) bool {
	span := int64(1)<<nodeLevel(n) - 1
	d := 2*int64(leaf) - int64(n)
	return -span <= d && d <= span
}

// WelcomeKeys is what [Installation.JoinKeys] learned: a hosted member's
// private part of a group it joins, and which epoch it is of.
type WelcomeKeys struct {
	Keys    *MemberKeys
	GroupID []byte
	Epoch   uint64
	// Context is the epoch's GroupContext (RFC 9420 §8.1), which names
	// the epoch's tree and transcript: [State.IsEpoch] compares it.
	Context []byte
	// KeyPackageRef is the consumed KeyPackage, as in JoinInfo.
	KeyPackageRef []byte
	// Adder is the GroupInfo signer's leaf (JOIN-025).
	Adder uint32
}

// ParsedWelcome is a Welcome message parsed once for the many hosted
// members it adds ([ParseWelcome], [Installation.JoinKeys]): parsing and
// naming it cost its size, which grows with the group.
type ParsedWelcome struct {
	id      [32]byte
	welcome *group.Welcome
}

// ParseWelcome parses a Welcome MLSMessage.
func ParseWelcome(welcomeMessage []byte) (pw *ParsedWelcome, err error) {
	const op = "join"
	defer recoverDecode(op, &err)
	c, err := Classify(welcomeMessage)
	if err != nil {
		return nil, err
	}
	if c.WireFormat != WireWelcome {
		return nil, fail(op, schema.CategoryInvalidEncoding, errors.New("not a Welcome"))
	}
	w, err := group.UnmarshalWelcome(welcomeMessage[4:])
	if err != nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	return &ParsedWelcome{id: welcomeID(welcomeMessage), welcome: w}, nil
}

// JoinKeys is [Installation.Join] for a member whose group's state is
// held already (internal/convergence's view of a group's hosted
// members): when c remembers a full join of the same Welcome (same
// joiner_secret, no PSKs, so the same GroupInfo every check of which
// passed, its signer an admin included), it returns only the member's
// private part, in O(log N), without a State. ok is false when c does not
// remember the Welcome: the caller then joins in full. Like Join, it
// changes nothing in inst.
func (inst *Installation) JoinKeys(pw *ParsedWelcome, c *WelcomeCache) (wk *WelcomeKeys, ok bool, err error) {
	const op = "join"
	defer recoverDecode(op, &err)
	if c == nil || pw.welcome.CipherSuite != inst.suite {
		return nil, false, nil
	}
	for _, s := range pw.welcome.Secrets {
		entry, found := inst.keyPackages[string(s.NewMember)]
		if !found {
			continue
		}
		ref := bytes.Clone(s.NewMember)
		keys, err := entry.privateKeys(inst.suite)
		if err != nil {
			return nil, false, fail(op, schema.CategoryInvalidEncoding, err)
		}
		gs, opened := openSecrets(pw.welcome, ref, keys)
		if !opened {
			return nil, false, nil
		}
		e := c.lookup(pw.id, pw.welcome.CipherSuite, gs.JoinerSecret.AsSlice())
		if e == nil {
			return nil, false, nil
		}
		mk, found := e.memberKeys(gs, entry.kp, keys)
		if !found {
			return nil, false, nil
		}
		return &WelcomeKeys{Keys: mk, GroupID: bytes.Clone(e.base.GroupID), Epoch: e.base.Epoch,
			Context: bytes.Clone(e.base.GroupContext), KeyPackageRef: ref, Adder: e.signer}, true, nil
	}
	return nil, false, fail(op, schema.CategoryWrongRecipient, ErrNoKeyPackage)
}

// IsEpoch reports whether context is the GroupContext of s's epoch.
func (s *State) IsEpoch(context []byte) bool {
	return bytes.Equal(s.g.GroupContext().Marshal(), context)
}

// welcomeID names a Welcome message in the cache.
func welcomeID(msg []byte) [32]byte { return sha256.Sum256(msg) }

// RememberWelcome makes c remember a Welcome into the epoch s holds as if
// one of its joiners had joined in full, so that [Installation.JoinKeys]
// serves every hosted member it adds: in a large group mls-go's full join
// (every leaf of the GroupInfo's tree checked) costs seconds, and the
// held state's tree was checked already when its commit was processed.
// inst is one of the joiners. It checks what a full join of it would:
// the GroupInfo decrypts under the joiner_secret's welcome key (RFC 9420
// §12.4.3.1) and names s's epoch (GroupContext and confirmation tag
// equal, and the joiner_secret leads to s's epoch_authenticator), its
// ratchet_tree extension is the held tree (its tree hash the
// GroupContext's), its signature verifies under its signer's leaf, and
// the signer is an admin when the group has components (Marmot
// joining.md step 8). ok is false, and c unchanged, when any of it does
// not hold or the Welcome needs PSKs: the caller then joins in full,
// which reports why.
func (s *State) RememberWelcome(inst *Installation, pw *ParsedWelcome, c *WelcomeCache) (ok bool, err error) {
	const op = "join"
	defer recoverDecode(op, &err)
	cs := s.g.CipherSuite()
	w := pw.welcome
	if c == nil || w.CipherSuite != cs || inst.suite != cs {
		return false, nil
	}
	var gs *group.Secrets
	for _, sec := range w.Secrets {
		entry, found := inst.keyPackages[string(sec.NewMember)]
		if !found {
			continue
		}
		keys, err := entry.privateKeys(cs)
		if err != nil {
			return false, nil
		}
		if gs, found = openSecrets(w, sec.NewMember, keys); !found {
			return false, nil
		}
		break
	}
	if gs == nil {
		return false, nil
	}
	joiner := gs.JoinerSecret.AsSlice()
	if c.lookup(pw.id, cs, joiner) != nil {
		return true, nil
	}
	// member_secret = Extract(joiner_secret, 0): no PSKs (openSecrets).
	member, err := ciphersuite.NewSecretForCS(cs, bytes.Clone(joiner)).HKDFExtract(ciphersuite.ZeroSecretCS(cs))
	if err != nil {
		return false, nil
	}
	defer member.SecureZero()
	welcomeSecret, err := member.DeriveSecret(cs, "welcome")
	if err != nil {
		return false, nil
	}
	defer welcomeSecret.SecureZero()
	key, err := welcomeSecret.KdfExpandLabel("key", []byte{}, cs.AEADKeyLength())
	if err != nil {
		return false, nil
	}
	defer key.SecureZero()
	nonce, err := welcomeSecret.KdfExpandLabel("nonce", []byte{}, cs.AEADNonceLength())
	if err != nil {
		return false, nil
	}
	defer nonce.SecureZero()
	plain, err := ciphersuite.DecryptWithCipherSuite(key.AsSlice(), nonce.AsSlice(), w.EncryptedGroupInfo, []byte{}, cs)
	if err != nil {
		return false, nil
	}
	info, err := group.UnmarshalGroupInfo(plain)
	if err != nil || info.GroupContext == nil {
		return false, nil
	}
	context := s.g.GroupContext().Marshal()
	if !bytes.Equal(info.GroupContext.Marshal(), context) || !bytes.Equal(info.ConfirmationTag, s.g.ConfirmationTag()) {
		return false, nil
	}
	epoch, err := member.KdfExpandLabel("epoch", context, cs.HashLength())
	if err != nil {
		return false, nil
	}
	defer epoch.SecureZero()
	auth, err := epoch.DeriveSecret(cs, "authentication")
	if err != nil || !bytes.Equal(auth.AsSlice(), s.g.EpochAuthenticator()) {
		return false, nil
	}
	if !treeExtensionIs(info, cs) {
		return false, nil
	}
	signer := s.g.GetTreeLeaf(info.Signer)
	if signer == nil || signer.State != treesync.NodeStatePresent || signer.LeafData == nil {
		return false, nil
	}
	pub := ciphersuite.NewMLSSignaturePublicKey(signer.LeafData.SigKeyBytes(), cs.SignatureScheme())
	if err := ciphersuite.VerifyWithLabel(pub, "GroupInfoTBS", info.MarshalTBS(), ciphersuite.NewSignature(info.Signature)); err != nil {
		return false, nil
	}
	set, found, err := s.Components()
	if err != nil {
		return false, nil
	}
	adder, present := s.Member(uint32(info.Signer))
	if !present || found && components.RoleOf(set, accountOf(adder.InboxID)) < components.RoleAdmin {
		return false, nil
	}
	c.remember(pw.id, cs, joiner, s.g, uint32(info.Signer))
	return c.lookup(pw.id, cs, joiner) != nil, nil
}

// treeExtensionIs reports whether the GroupInfo carries a ratchet_tree
// extension whose tree hash is its GroupContext's (RFC 9420 §12.4.3.1).
func treeExtensionIs(info *group.Info, cs ciphersuite.CipherSuite) bool {
	for _, ext := range info.Extensions {
		if ext.Type != mlsext.ExtensionTypeRatchetTree {
			continue
		}
		t, err := treesync.UnmarshalTreeFromExtension(ext.Data, cs)
		if err != nil {
			return false
		}
		return bytes.Equal(t.ExpandToPowerOf2().TreeHash(), info.GroupContext.TreeHash)
	}
	return false
}
