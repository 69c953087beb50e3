package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"strconv"

	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"
	"github.com/thomas-vilte/mls-go/treesync"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// This file lets many hosted members of one group share one State
// (docs/shared-state.md): the tree, the GroupContext, the key schedule and
// the secret tree of an epoch are the same for every member; only a
// member's leaf HPKE key and the private keys of its direct path
// ([MemberKeys], O(log N)) and its signature key are its own.

// MemberKeys is one member's private part of a group's epoch: its leaf, the
// leaf's HPKE private key, and the private keys of the present nodes on its
// direct path (RFC 9420 §12.4.2), by node index. It holds secrets: seal it
// as a snapshot.
type MemberKeys struct {
	Leaf    uint32            `json:"leaf"`
	LeafKey []byte            `json:"leaf_key"`
	Path    map[uint32][]byte `json:"path,omitempty"`
}

// Equal reports whether k and o hold the same keys.
func (k *MemberKeys) Equal(o *MemberKeys) bool {
	return k.Leaf == o.Leaf && bytes.Equal(k.LeafKey, o.LeafKey) &&
		maps.EqualFunc(k.Path, o.Path, func(a, b []byte) bool { return bytes.Equal(a, b) })
}

// ErrNotShareable: the message cannot be processed once for every hosted
// member (an external commit, whose committer's leaf is not known before).
var ErrNotShareable = errors.New("message cannot be processed on a shared state")

// privateJSON is the tail of mls-go's StateData JSON: the own private keys.
type privateJSON struct {
	LeafKey []byte                        `json:"my_leaf_encryption_key"`
	Path    map[treesync.NodeIndex][]byte `json:"path_node_priv_keys,omitempty"`
}

var (
	jsonOwnLeaf    = []byte(`"own_leaf_index":`)
	jsonMyLeafKey  = []byte(`,"my_leaf_encryption_key":`)
	errStateLayout = errors.New("state JSON not laid out as expected")
)

// graftJSON returns raw, mls-go's MarshalState JSON (group.StateData), with
// the own leaf and private keys of k. StateData's field order puts
// own_leaf_index before the ratchet tree and the private keys last; the
// spans before them hold numbers and base64, which hold no quote, so the
// first own_leaf_index and the last my_leaf_encryption_key are the fields.
func graftJSON(raw []byte, k *MemberKeys) ([]byte, error) {
	i := bytes.Index(raw, jsonOwnLeaf)
	t := bytes.LastIndex(raw, jsonMyLeafKey)
	if i < 0 || t < i {
		return nil, errStateLayout
	}
	from := i + len(jsonOwnLeaf)
	to := from
	for to < len(raw) && raw[to] >= '0' && raw[to] <= '9' {
		to++
	}
	priv := privateJSON{LeafKey: k.LeafKey}
	if len(k.Path) > 0 {
		priv.Path = make(map[treesync.NodeIndex][]byte, len(k.Path))
		for n, v := range k.Path {
			priv.Path[treesync.NodeIndex(n)] = v
		}
	}
	p, err := json.Marshal(priv)
	if err != nil {
		return nil, err
	}
	defer clear(p)
	out := make([]byte, 0, len(raw)+len(p))
	out = append(out, raw[:from]...)
	out = strconv.AppendUint(out, uint64(k.Leaf), 10)
	out = append(out, raw[to:t]...)
	out = append(out, ',')
	return append(out, p[1:]...), nil
}

// MemberKeys returns the state's own member's private part: its leaf, leaf
// key and the keys of the present nodes of its direct path. It encodes the
// state (O(N)); a shared group asks once per join and once per commit.
func (s *State) MemberKeys() (*MemberKeys, error) {
	shape, err := s.TreeShape()
	if err != nil {
		return nil, err
	}
	return s.MemberKeysIn(shape)
}

// MemberKeysIn is [State.MemberKeys] with s's tree shape at hand.
func (s *State) MemberKeysIn(shape *TreeShape) (*MemberKeys, error) {
	raw, err := s.marshalState(nil, nil)
	if err != nil {
		return nil, fmt.Errorf("engine: member keys: %w", err)
	}
	defer clear(raw)
	priv, err := privateOf(raw)
	if err != nil {
		return nil, err
	}
	return shape.keep(s.OwnLeaf(), priv), nil
}

// keep returns the member keys of leaf: priv restricted to the present
// nodes of its direct path.
func (t *TreeShape) keep(leaf uint32, priv *privateJSON) *MemberKeys {
	k := &MemberKeys{Leaf: leaf, LeafKey: priv.LeafKey, Path: make(map[uint32][]byte)}
	for _, n := range t.path(leaf) {
		if v, ok := priv.Path[n]; ok {
			k.Path[uint32(n)] = v
		}
	}
	return k
}

// privateOf reads the own private keys from MarshalState JSON.
func privateOf(raw []byte) (*privateJSON, error) {
	t := bytes.LastIndex(raw, jsonMyLeafKey)
	if t < 0 {
		return nil, fmt.Errorf("engine: member keys: %w", errStateLayout)
	}
	tail := append([]byte{'{'}, raw[t+1:]...)
	defer clear(tail)
	var priv privateJSON
	if err := json.Unmarshal(tail, &priv); err != nil {
		return nil, fmt.Errorf("engine: member keys: %w", err)
	}
	return &priv, nil
}

// As returns a copy of s whose own member is k's: the same group, epoch,
// tree and secrets, with k's leaf and private keys. It costs what Clone
// costs (O(N)).
func (s *State) As(k *MemberKeys) (*State, error) {
	b, err := s.snapshotAs(false, k)
	if err != nil {
		return nil, err
	}
	return s.restoreCopy(b)
}

// ProcessAs is [State.ProcessHandshake] for the member of k: the copy it
// returns is that member's (its leaf, its keys after the commit). Another
// hosted member's keys then follow the commit from it
// ([TreeShape.FollowCommit]) without a decapsulation of their own.
func (s *State) ProcessAs(k *MemberKeys, mlsMessage []byte) (*State, *HandshakeResult, error) {
	return s.processHandshake(mlsMessage, k)
}

// CommitPlan is what a commit does that a shared group needs before
// processing it: who commits and which leaves it removes.
type CommitPlan struct {
	Committer uint32
	Removed   []uint32
}

// PlanCommit reads a commit of s's epoch (PublicMessage) for its committer
// and removed leaves, resolving proposals by reference against s. An
// external commit fails with [ErrNotShareable].
func (s *State) PlanCommit(mlsMessage []byte) (plan *CommitPlan, err error) {
	const op = "plan commit"
	defer recoverDecode(op, &err)
	c, pm, err := parsePublicHandshake(op, mlsMessage)
	if err != nil {
		return nil, err
	}
	if c.Class != schema.ClassCommit {
		return nil, fail(op, schema.CategoryInvalidEncoding, errors.New("not a commit"))
	}
	if pm.Content.Sender.Type != framing.SenderTypeMember {
		return nil, fail(op, schema.CategoryUnsupportedRequiredFeature, ErrNotShareable)
	}
	committer, _ := s.Member(pm.Content.Sender.LeafIndex)
	_, shape, err := s.commitOps(pm, committer)
	if err != nil {
		return nil, err
	}
	return &CommitPlan{Committer: pm.Content.Sender.LeafIndex, Removed: shape.removed}, nil
}

// TreeShape is which nodes of a state's ratchet tree are present: enough
// to follow a member's keys through a commit in O(log N).
type TreeShape struct {
	tree *treesync.RatchetTree
}

// TreeShape returns the shape of s's ratchet tree (O(N), once per epoch).
func (s *State) TreeShape() (*TreeShape, error) {
	t, err := treesync.UnmarshalTree(s.g.MarshalRatchetTree(), s.g.CipherSuite())
	if err != nil {
		return nil, fail("tree shape", schema.CategoryInvalidEncoding, err)
	}
	return &TreeShape{tree: t}, nil
}

// path returns the present nodes of leaf's direct path, leaf excluded.
func (t *TreeShape) path(leaf uint32) []treesync.NodeIndex {
	if leaf >= t.tree.NumLeaves {
		return nil
	}
	dp := t.tree.DirectPath(treesync.LeafIndex(leaf))
	out := make([]treesync.NodeIndex, 0, len(dp))
	for _, n := range dp {
		if treesync.IsLeaf(n) || int(n) >= len(t.tree.Nodes) || t.tree.Nodes[n].State != treesync.NodeStatePresent {
			continue
		}
		out = append(out, n)
	}
	return out
}

// LCALevel returns the level of the lowest common ancestor of two leaves
// (leaves are level 0): the lowest level at which a commit by one changes
// the other's path keys (RFC 9420 §12.4.2).
func LCALevel(a, b uint32) int { return bits.Len32(a ^ b) }

// nodeLevel is a node's level in the array layout of RFC 9420 Appendix C.
func nodeLevel(n treesync.NodeIndex) int { return bits.TrailingZeros32(^uint32(n)) }

// FollowCommit returns the keys of member m after a commit by committer,
// t being the tree after it, from m's keys before and those of the
// carrier, the hosted member that processed the commit (or made it),
// before and after. The carrier's lowest common ancestor with the
// committer must be at most as high as m's: the nodes of m's path from
// its own LCA up are then on the carrier's path too, and those the commit
// re-keyed (the carrier's key there changed) get the carrier's new key;
// m keeps its own keys elsewhere. Nodes no longer present are dropped, so
// the result holds what an mls-go member that processed the commit holds
// (internal/convergence TestHostedKeysEqualStandaloneMembers).
func (t *TreeShape) FollowCommit(m *MemberKeys, committer uint32, before, after *MemberKeys) *MemberKeys {
	lca := LCALevel(m.Leaf, committer)
	out := &MemberKeys{Leaf: m.Leaf, LeafKey: m.LeafKey, Path: make(map[uint32][]byte)}
	for _, n := range t.path(m.Leaf) {
		k := uint32(n)
		if nodeLevel(n) >= lca {
			if v, ok := after.Path[k]; ok && !bytes.Equal(v, before.Path[k]) {
				out.Path[k] = v
				continue
			}
		}
		if v, ok := m.Path[k]; ok {
			out.Path[k] = v
		}
	}
	return out
}

// EncryptAs encrypts payload as an application PrivateMessage of this
// epoch sent by the member at leaf, signed by inst, on s's secret tree
// (RFC 9420 §6.3.1): that leaf's sending ratchet moves in s, which every
// hosted member of the epoch shares, so one leaf never reuses a
// generation. It returns the MLSMessage and its generation.
func (s *State) EncryptAs(inst *Installation, leaf uint32, payload []byte) (msg []byte, generation uint32, err error) {
	const op = "encrypt"
	defer recoverDecode(op, &err)
	m, ok := s.Member(leaf)
	if !ok || !bytes.Equal(m.InstallationKey, inst.sigPub) {
		return nil, 0, fail(op, schema.CategoryWrongRecipient, ErrNotOwnInstallation)
	}
	if s.g.State() != group.StateOperational {
		return nil, 0, classifyMLSGoError(op, group.ErrGroupNotOperational)
	}
	if len(s.g.StoredProposals()) > 0 {
		return nil, 0, classifyMLSGoError(op, group.ErrPendingProposals)
	}
	secrets, tree := s.g.EpochSecrets(), s.g.SecretTree()
	if secrets == nil || secrets.SenderDataSecret == nil || tree == nil {
		return nil, 0, fail(op, schema.CategoryInvalidEncoding, errors.New("epoch secrets missing"))
	}
	s.changes++
	s.ratchets++
	pm, err := framing.Encrypt(framing.EncryptParams{
		Content: framing.FramedContent{
			GroupID: s.g.ID().AsSlice(),
			Epoch:   s.Epoch(),
			Sender:  framing.Sender{Type: framing.SenderTypeMember, LeafIndex: leaf},
			Body:    framing.ApplicationData{Data: payload},
		},
		SenderLeafIndex:  leaf,
		CipherSuite:      s.g.CipherSuite(),
		PaddingSize:      s.g.PaddingSize(),
		SenderDataSecret: secrets.SenderDataSecret,
		SecretTree:       tree,
		SigKey:           inst.signer(),
		GroupContext:     s.g.GroupContext().Marshal(),
	})
	if err != nil {
		return nil, 0, classifyMLSGoError(op, err)
	}
	gen, err := senderGeneration(pm, secrets.SenderDataSecret, s.g.CipherSuite())
	if err != nil {
		return nil, 0, classifyMLSGoError(op, err)
	}
	return framing.NewMLSMessagePrivate(pm).Marshal(), gen, nil
}
