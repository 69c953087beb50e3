package engine

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// MaxTreeLeaves bounds the leaf count a restored ratchet tree may declare.
// mls-go allocates the whole tree from that declared count before reading a
// node, so a damaged count would cost seconds or exhaust memory; 65,536
// leaves is far beyond any group the fabric hosts.
const MaxTreeLeaves = 1 << 16

// Bounds on the other counts of a snapshot (each far above what a live state
// of MaxTreeLeaves leaves holds).
const (
	maxSnapshotPSKs = 1 << 8
	// keptResumptionEpochs is how many of the group's latest epochs keep
	// their resumption PSK in a snapshot (see State.snapshot).
	keptResumptionEpochs = 16
	maxStoredProposals   = MaxTreeLeaves
)

// ErrBadSnapshot: the bytes are not an intact state snapshot. Restore fails
// with it, category missing_history, before mls-go sees bytes whose
// structure is inconsistent.
var ErrBadSnapshot = errors.New("not an intact state snapshot")

// snapshotShape is the part of mls-go's state JSON whose sizes drive the
// work UnmarshalGroupState does; everything else stays undecoded.
type snapshotShape struct {
	CipherSuite  uint16          `json:"cipher_suite"`
	OwnLeafIndex uint32          `json:"own_leaf_index"`
	RatchetTree  []byte          `json:"ratchet_tree"`
	EpochSecrets json.RawMessage `json:"epoch_secrets"`
	SecretTree   *struct {
		EncryptionSecret []byte                     `json:"encryption_secret"`
		LeafCount        uint32                     `json:"leaf_count"`
		LeafStates       map[uint32]json.RawMessage `json:"leaf_states"`
	} `json:"secret_tree"`
	Members map[uint32]struct {
		Active bool `json:"active"`
	} `json:"members"`
	StoredProposals  []json.RawMessage          `json:"stored_proposals"`
	CachedPsks       map[string]json.RawMessage `json:"cached_psks"`
	PathNodePrivKeys map[uint32]json.RawMessage `json:"path_node_priv_keys"`
}

// checkSnapshot is Restore's structural pre-validation: every count mls-go
// allocates or iterates by is bounded, and bounded by the bytes present,
// so a damaged snapshot fails in time linear in its size.
func checkSnapshot(env *snapshotEnvelope) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadSnapshot}, args...)...)
	}
	var sh snapshotShape
	if err := json.Unmarshal(env.State, &sh); err != nil {
		return bad("state: %v", err)
	}
	if !SupportedCipherSuite(sh.CipherSuite) {
		return bad("cipher suite %d", sh.CipherSuite)
	}
	if len(sh.EpochSecrets) == 0 || string(sh.EpochSecrets) == "null" {
		return bad("no epoch secrets")
	}
	// MarshalTree layout: uint32 num_leaves, then 2·num_leaves−1 nodes of at
	// least one byte (the node type) each.
	if len(sh.RatchetTree) < 4 {
		return bad("ratchet tree of %d bytes", len(sh.RatchetTree))
	}
	leaves := binary.BigEndian.Uint32(sh.RatchetTree)
	if leaves == 0 || leaves > MaxTreeLeaves || uint64(2*leaves-1) > uint64(len(sh.RatchetTree)-4) {
		return bad("ratchet tree declares %d leaves in %d bytes", leaves, len(sh.RatchetTree))
	}
	nodes := 2*leaves - 1
	if sh.OwnLeafIndex >= leaves {
		return bad("own leaf %d of %d", sh.OwnLeafIndex, leaves)
	}
	// mls-go keeps a removed member, inactive, after a removal truncated
	// the tree below its leaf (issue 26: the last leaf's removal), so only
	// an active member must be a leaf of the tree.
	if len(sh.Members) > MaxTreeLeaves {
		return bad("%d members", len(sh.Members))
	}
	for i, m := range sh.Members {
		if i >= MaxTreeLeaves || (m.Active && i >= leaves) {
			return bad("member leaf %d of %d (active %v)", i, leaves, m.Active)
		}
	}
	// MarshalState always writes the secret tree with its secret. Without
	// one mls-go would derive a tree from the epoch's encryption secret,
	// even an empty one, and the state would snapshot to bytes it refuses.
	st := sh.SecretTree
	if st == nil || len(st.EncryptionSecret) == 0 {
		return bad("no secret tree, or one without its secret")
	}
	if st.LeafCount == 0 || st.LeafCount > MaxTreeLeaves || len(st.LeafStates) > int(st.LeafCount) {
		return bad("secret tree of %d leaves with %d leaf states", st.LeafCount, len(st.LeafStates))
	}
	for i := range sh.PathNodePrivKeys {
		if i >= nodes {
			return bad("path key for node %d of %d", i, nodes)
		}
	}
	if len(sh.StoredProposals) > maxStoredProposals {
		return bad("%d stored proposals", len(sh.StoredProposals))
	}
	if len(sh.CachedPsks) > maxSnapshotPSKs || len(env.PSKs) > maxSnapshotPSKs {
		return bad("%d cached PSKs", max(len(sh.CachedPsks), len(env.PSKs)))
	}
	return nil
}
