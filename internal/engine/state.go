package engine

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/thomas-vilte/mls-go/group"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// GroupEventLabel and GroupEventContext are the exporter inputs of the group
// event key that seals transport messages (DESIGN §3).
const (
	GroupEventLabel   = "fabric"
	GroupEventContext = "group-event"
)

// State is one hosted member's MLS state of one group at one epoch. The
// handshake methods never mutate it; [State.Decrypt] advances the secret
// tree in place. A State is not safe for concurrent use.
type State struct {
	g *group.Group
	// changes counts in-place mutations (see [State.Changes]), ratchets
	// those of Decrypt, which move only the secret tree.
	changes, ratchets uint64
	// json is the state's MarshalState JSON as last cut ([stateJSON]).
	json atomic.Pointer[stateJSON]
	// sigs, when set, remembers verified signatures ([State.ShareSignatures]).
	sigs *SignatureCache
	// pending are the own commits made on this state, not yet come back
	// ([State.Commit]); sent the ids of the application messages it
	// encrypted ([State.Encrypt]). Both are kept in its snapshot.
	pending []pendingCommit
	sent    [][]byte
	// inboxes remembers InboxIDs for one tree: the tree changes only by
	// a commit, which moves the epoch (RFC 9420 §12.4).
	inboxes atomic.Pointer[inboxMemo]
	// eventKey remembers GroupEventKey for one epoch: an exporter secret
	// is one epoch's (RFC 9420 §8.5), and converge asks every hosted
	// member's states for theirs after each input.
	eventKey atomic.Pointer[eventKeyMemo]
}

// eventKeyMemo is GroupEventKey of g at epoch.
type eventKeyMemo struct {
	g     *group.Group
	epoch uint64
	key   [32]byte
}

// inboxMemo is InboxIDs of the tree of g at epoch.
type inboxMemo struct {
	g     *group.Group
	epoch uint64
	ids   []string
}

// Changes counts the calls that may have changed s in place (every
// [State.Decrypt] that reached the secret tree, successful or not). Equal
// counts mean s still serializes to what an earlier [State.Snapshot]
// returned, so a caller may reuse those bytes instead of re-encoding.
func (s *State) Changes() uint64 { return s.changes }

// Member is one leaf of a group.
type Member struct {
	Leaf            uint32
	InboxID         string // lowercase hex of the credential identity
	InstallationKey []byte // the leaf's signature public key
}

// GroupID returns the MLS group id.
func (s *State) GroupID() []byte { return slices.Clone(s.g.ID().AsSlice()) }

// Epoch returns the epoch.
func (s *State) Epoch() uint64 { return s.g.Epoch().AsUint64() }

// CipherSuite returns the group's cipher suite.
func (s *State) CipherSuite() uint16 { return uint16(s.g.CipherSuite()) }

// EpochAuthenticator returns the RFC 9420 §8.7 epoch authenticator.
func (s *State) EpochAuthenticator() []byte { return slices.Clone(s.g.EpochAuthenticator()) }

// OwnLeaf returns the hosted member's leaf index.
func (s *State) OwnLeaf() uint32 { return uint32(s.g.OwnLeafIndex()) }

// Exporter returns MLS-Exporter(label, context, length) of this epoch
// (RFC 9420 §8.5).
func (s *State) Exporter(label string, context []byte, length int) ([]byte, error) {
	out, err := s.g.Export(label, context, length)
	if err != nil {
		return nil, fmt.Errorf("engine: exporter: %w", err)
	}
	return out, nil
}

// GroupEventKey returns MLS-Exporter("fabric", "group-event", 32), the key
// that seals this epoch's transport messages (DESIGN §3).
func (s *State) GroupEventKey() ([32]byte, error) {
	var k [32]byte
	epoch := s.Epoch()
	if m := s.eventKey.Load(); m != nil && m.g == s.g && m.epoch == epoch {
		return m.key, nil
	}
	out, err := s.Exporter(GroupEventLabel, []byte(GroupEventContext), 32)
	if err != nil {
		return k, err
	}
	copy(k[:], out)
	s.eventKey.Store(&eventKeyMemo{g: s.g, epoch: epoch, key: k})
	return k, nil
}

// Members returns the group's leaves in leaf order.
func (s *State) Members() []Member {
	var out []Member
	for _, m := range s.g.GetMembers() {
		if m == nil || !m.Active {
			continue
		}
		out = append(out, s.member(uint32(m.LeafIndex)))
	}
	slices.SortFunc(out, func(a, b Member) int { return int(a.Leaf) - int(b.Leaf) })
	return out
}

// InboxIDs returns the distinct inbox ids of the members, sorted.
func (s *State) InboxIDs() []string {
	epoch := s.Epoch()
	if m := s.inboxes.Load(); m != nil && m.g == s.g && m.epoch == epoch {
		return slices.Clone(m.ids)
	}
	var out []string
	for _, m := range s.Members() {
		out = append(out, m.InboxID)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	s.inboxes.Store(&inboxMemo{g: s.g, epoch: epoch, ids: out})
	return slices.Clone(out)
}

// Member returns the member at leaf, or false when the leaf is blank.
func (s *State) Member(leaf uint32) (Member, bool) {
	m, ok := s.g.GetMember(group.LeafNodeIndex(leaf))
	if !ok || m == nil || !m.Active {
		return Member{}, false
	}
	return s.member(leaf), true
}

func (s *State) member(leaf uint32) Member {
	out := Member{Leaf: leaf, InstallationKey: slices.Clone(s.g.MemberSigningKey(group.LeafNodeIndex(leaf)))}
	if node := s.g.GetTreeLeaf(group.LeafNodeIndex(leaf)); node != nil && node.LeafData != nil && node.LeafData.Credential != nil {
		out.InboxID = hex.EncodeToString(node.LeafData.Credential.Identity)
	} else if m, ok := s.g.GetMember(group.LeafNodeIndex(leaf)); ok && m.Credential != nil {
		out.InboxID = hex.EncodeToString(m.Credential.Identity)
	}
	return out
}

// Components returns the group's components; found is false when the group
// carries no components extension.
func (s *State) Components() (set components.Set, found bool, err error) {
	set, found, err = components.FromExtensions(s.g.GroupContext().Extensions)
	if err != nil {
		return components.Set{}, false, fail("components", schema.CategoryInvalidEncoding, err)
	}
	return set, found, nil
}

// snapshotEnvelope is the Snapshot format: mls-go's MarshalState JSON plus
// the cached PSKs again. mls-go keeps those in a map[string][]byte whose keys
// hold raw bytes (a group id for resumption PSKs), and JSON map keys do not
// survive non-UTF-8 bytes, so a restored mls-go state alone would lose them.
type snapshotEnvelope struct {
	V     int             `json:"v"`
	State json.RawMessage `json:"state"`
	PSKs  [][2][]byte     `json:"psks,omitempty"`
	// Pending holds the own commits not yet come back: [id, snapshot].
	Pending [][2][]byte `json:"pending,omitempty"`
	// Sent holds the ids of this epoch's own application messages.
	Sent [][]byte `json:"sent,omitempty"`
}

// Snapshot serializes the whole state (mls-go MarshalState). The bytes hold
// epoch secrets and private keys: seal them with [Vault.SealState] before
// they leave the process.
func (s *State) Snapshot() ([]byte, error) { return s.snapshot(true) }

// snapshot is Snapshot; own is false for a copy without the own commits and
// sent ids, which Clone then shares.
func (s *State) snapshot(own bool) ([]byte, error) { return s.snapshotAs(own, nil) }

// snapshotAs is snapshot; with as set, the state's own leaf and private
// keys in it are as's ([State.As]).
func (s *State) snapshotAs(own bool, as *MemberKeys) ([]byte, error) {
	env := snapshotEnvelope{V: 1}
	psks := s.g.CachedPsks()
	for _, k := range slices.Sorted(maps.Keys(psks)) {
		if s.staleResumption(k) {
			continue
		}
		env.PSKs = append(env.PSKs, [2][]byte{[]byte(k), psks[k]})
	}
	if own {
		for _, p := range s.pending {
			env.Pending = append(env.Pending, [2][]byte{p.id, p.state})
		}
		env.Sent = s.sent
	}
	head, tail, err := envelopeAround(env)
	if err != nil {
		return nil, fmt.Errorf("engine: snapshot: %w", err)
	}
	if as != nil {
		raw, err := s.marshalState(nil, nil)
		if err != nil {
			return nil, fmt.Errorf("engine: snapshot: %w", err)
		}
		defer clear(raw)
		grafted, err := graftJSON(raw, as)
		if err != nil {
			return nil, fmt.Errorf("engine: snapshot: %w", err)
		}
		defer clear(grafted)
		out := make([]byte, 0, len(head)+len(grafted)+len(tail))
		return append(append(append(out, head...), grafted...), tail...), nil
	}
	b, err := s.marshalState(head, tail)
	if err != nil {
		return nil, fmt.Errorf("engine: snapshot: %w", err)
	}
	return b, nil
}

// staleResumption reports whether the cached PSK of key is this group's
// resumption PSK of an epoch older than the latest keptResumptionEpochs.
// mls-go caches one each epoch and never drops any (RFC 9420 §8.6 leaves
// how long to keep them to the application); the fabric uses none (no
// reinit, no branch), and a snapshot that kept them all would grow with
// the group's age and, past maxSnapshotPSKs epochs, no longer restore.
func (s *State) staleResumption(key string) bool {
	id := s.g.ID().AsSlice()
	if len(key) != len(id)+8 || key[:len(id)] != string(id) {
		return false
	}
	epoch := binary.BigEndian.Uint64([]byte(key[len(id):]))
	return epoch+keptResumptionEpochs <= s.Epoch()
}

// envelopeAround returns what json.Marshal(env) writes before and after
// env.State, so the state's JSON is written between them as it is:
// encoding/json would scan and compact it once more, a third of a
// snapshot's CPU, and mls-go's MarshalState writes it with encoding/json,
// valid and compact (TestSnapshotEnvelopeAsJSONEncodesIt).
func envelopeAround(env snapshotEnvelope) (head, tail []byte, err error) {
	env.State = json.RawMessage("0")
	rest, err := json.Marshal(env)
	if err != nil {
		return nil, nil, err
	}
	head = fmt.Appendf(nil, `{"v":%d,"state":`, env.V)
	tail, ok := bytes.CutPrefix(rest, append(head, '0'))
	if !ok {
		return nil, nil, errors.New("snapshot envelope: unexpected encoding")
	}
	return head, tail, nil
}

// Restore rebuilds a State from Snapshot bytes, checking its consistency
// (mls-go UnmarshalGroupState, which verifies the tree hash). Before mls-go
// sees the bytes, their structure is checked: counts such as the ratchet
// tree's declared leaf count (at most [MaxTreeLeaves]) are bounded and must
// fit the bytes present, so a damaged snapshot fails fast. Every failure,
// including a panic inside mls-go, has category missing_history: the
// retained state is lost.
func Restore(snapshot []byte) (st *State, err error) {
	return restore(snapshot, true)
}

// restore is Restore; check is false only for bytes this process's own
// Snapshot just produced (Clone), which skip the structural pre-validation.
func restore(snapshot []byte, check bool) (st *State, err error) {
	const op = "restore"
	defer func() {
		if r := recover(); r != nil {
			st, err = nil, fail(op, schema.CategoryMissingHistory, ErrParserPanic)
		}
	}()
	var env snapshotEnvelope
	if err := json.Unmarshal(snapshot, &env); err != nil || env.V != 1 {
		return nil, fail(op, schema.CategoryMissingHistory, ErrBadSnapshot)
	}
	if check {
		if err := checkSnapshot(&env); err != nil {
			return nil, fail(op, schema.CategoryMissingHistory, err)
		}
	}
	state, err := withoutCachedPSKs(env.State)
	if err != nil {
		return nil, fail(op, schema.CategoryMissingHistory, ErrBadSnapshot)
	}
	defer clear(state)
	g, err := group.UnmarshalGroupState(state)
	if err != nil {
		return nil, fail(op, schema.CategoryMissingHistory, err)
	}
	for _, kv := range env.PSKs {
		g.LoadPsk(kv[0], kv[1])
	}
	st = &State{g: g, sent: env.Sent}
	for _, p := range env.Pending {
		st.pending = append(st.pending, pendingCommit{id: p[0], state: p[1]})
	}
	return st, nil
}

// withoutCachedPSKs returns a copy of mls-go's state JSON with its cached
// PSKs null: there an id that is not UTF-8 is mangled, and mls-go would
// hold the PSK under the mangled id beside the envelope's, so a restored
// state would snapshot to other bytes (and hold every such PSK twice).
// The envelope has them all.
func withoutCachedPSKs(state []byte) ([]byte, error) {
	key := []byte(`"cached_psks":`)
	at := bytes.Index(state, key)
	if at < 0 {
		return slices.Clone(state), nil
	}
	from := at + len(key)
	dec := json.NewDecoder(bytes.NewReader(state[from:]))
	var psks json.RawMessage
	if err := dec.Decode(&psks); err != nil {
		return nil, err
	}
	end := from + int(dec.InputOffset())
	out := make([]byte, 0, len(state)-(end-from)+len("null"))
	return append(append(append(out, state[:from]...), "null"...), state[end:]...), nil
}

// restoreCopy restores b, an in-memory snapshot of s (cleared after), as a
// state that shares s's signature cache.
func (s *State) restoreCopy(b []byte) (*State, error) {
	defer clear(b)
	c, err := restore(b, false)
	if err != nil {
		return nil, err
	}
	c.sigs = s.sigs
	return c, nil
}

// Clone returns an independent copy of s, through a snapshot round trip.
func (s *State) Clone() (*State, error) {
	b, err := s.snapshot(false)
	if err != nil {
		return nil, err
	}
	c, err := s.restoreCopy(b)
	if err != nil {
		return nil, err
	}
	// Pending snapshots are never changed in place, so copies share them.
	c.pending, c.sent = slices.Clone(s.pending), slices.Clone(s.sent)
	return c, nil
}

// String describes the state without ids or secrets.
func (s *State) String() string {
	return fmt.Sprintf("engine.State{epoch:%d members:%d}", s.Epoch(), s.g.MemberCount())
}

// Format makes every fmt verb print String, so no verb reaches a secret.
func (s *State) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.String())) }

// accountOf returns the 32-byte account id of an inbox id, or the zero id
// when the credential identity is not 32 bytes (such a member matches no
// admin entry).
func accountOf(inboxID string) components.AccountID {
	a, err := components.ParseInboxID(inboxID)
	if err != nil {
		return components.AccountID{}
	}
	return a
}

// checkGroup rejects a message naming another group.
func (s *State) checkGroup(op string, c Classification) error {
	if !bytes.Equal(c.GroupID, s.g.ID().AsSlice()) {
		return fail(op, schema.CategoryWrongRecipient, ErrWrongGroup)
	}
	return nil
}

// checkEpoch rejects a message of another epoch than the state's.
func (s *State) checkEpoch(op string, c Classification) error {
	switch {
	case c.Epoch < s.Epoch():
		return fail(op, schema.CategoryStaleEpoch, ErrWrongEpoch)
	case c.Epoch > s.Epoch():
		return fail(op, schema.CategoryMissingHistory, ErrFutureEpoch)
	}
	return nil
}

// classifyMLSGoError maps an mls-go processing error to a category.
func classifyMLSGoError(op string, err error) error {
	var sig *group.ErrInvalidSignature
	var epoch *group.ErrEpochMismatch
	var gid *group.ErrGroupIDMismatch
	switch {
	case errors.As(err, &sig):
		return fail(op, schema.CategoryInvalidSignature, err)
	case errors.As(err, &epoch):
		return fail(op, schema.CategoryStaleEpoch, err)
	case errors.As(err, &gid):
		return fail(op, schema.CategoryWrongRecipient, err)
	case errors.Is(err, group.ErrRequiredExtensionMissing):
		return fail(op, schema.CategoryUnsupportedRequiredFeature, err)
	}
	return fail(op, schema.CategoryInvalidEncoding, err)
}
