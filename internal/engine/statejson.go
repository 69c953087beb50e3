package engine

import (
	"bytes"
	"encoding/json"
	"slices"
	"unique"

	"github.com/thomas-vilte/mls-go/group"
)

// stateJSON is mls-go's MarshalState JSON of g, its cached PSKs left out
// (the snapshot envelope holds them), cut around its secret tree,
// the one part of the state Decrypt moves in place (RFC 9420 §9: a
// sender's ratchet advances as its keys are used). A later snapshot of the
// same g with no other change since splices the secret tree's new JSON in
// instead of encoding the ratchet tree and the members again: at 100
// members that was two thirds of a snapshot's CPU. The two public spans
// every member of an epoch holds alike, ratchet tree to confirmation tag
// and the members with the stored proposals, are interned, so a group's
// hosted members keep one copy of them between them.
type stateJSON struct {
	g      *group.Group
	others uint64 // changes - ratchets when cut
	// head is {"group_id" … "own_leaf_index":n, secrets the epoch secrets
	// up to "secret_tree":, tail the cached PSKs and the own private keys.
	head, secrets, tail []byte
	// tree is ,"ratchet_tree" … "confirmation_tag":"…", members
	// ,"members":{…} up to the cached PSKs.
	tree, members unique.Handle[string]
}

// The keys the cuts are made before, in MarshalState's field order
// (group.StateData). The spans between them hold numbers, JSON objects
// of fixed keys and base64 strings, which hold no quote, so each key's
// first occurrence after the one before is the field.
var (
	jsonRatchetTree  = []byte(`,"ratchet_tree":`)
	jsonEpochSecrets = []byte(`,"epoch_secrets":`)
	jsonSecretTree   = []byte(`,"secret_tree":`)
	jsonMembers      = []byte(`,"members":`)
	jsonCachedPSKs   = []byte(`,"cached_psks":`)
)

// cutAtLeast is the size of the JSON from which a state is cut: a
// smaller one (a group of a few dozen members or fewer) costs mls-go less
// to encode again than the cut would keep in memory per hosted member.
const cutAtLeast = 16 << 10

// marshalState returns s.g.MarshalState() between head and tail: spliced
// from the last cut when only Decrypt changed s since, else encoded by
// mls-go and cut for the next time.
func (s *State) marshalState(head, tail []byte) ([]byte, error) {
	others := s.changes - s.ratchets
	if j := s.json.Load(); j != nil && j.g == s.g && j.others == others {
		tree, err := json.Marshal(s.g.SecretTree().MarshalFull())
		if err != nil {
			return nil, err
		}
		defer clear(tree)
		return j.splice(head, tree, tail), nil
	}
	full, err := s.g.MarshalState()
	if err != nil {
		return nil, err
	}
	defer clear(full)
	// The envelope holds the cached PSKs (pruned, with their ids intact):
	// mls-go's copy of them is left out of the state's JSON.
	raw, err := withoutCachedPSKs(full)
	if err != nil {
		return nil, err
	}
	defer clear(raw)
	var j *stateJSON
	if st := s.g.SecretTree(); st != nil && len(raw) >= cutAtLeast {
		tree, err := json.Marshal(st.MarshalFull())
		if err != nil {
			return nil, err
		}
		j = cutStateJSON(s.g, raw, tree)
		clear(tree)
	}
	if j != nil {
		j.others = others
	}
	s.json.Store(j)
	out := make([]byte, 0, len(head)+len(raw)+len(tail))
	return append(append(append(out, head...), raw...), tail...), nil
}

// cutStateJSON cuts raw, MarshalState's JSON of g whose secret tree
// encodes to tree, or returns nil when raw is not laid out as expected.
func cutStateJSON(g *group.Group, raw, tree []byte) *stateJSON {
	after := func(from int, key []byte) int {
		if from < 0 {
			return -1
		}
		i := bytes.Index(raw[from:], key)
		if i < 0 {
			return -1
		}
		return from + i
	}
	a := after(0, jsonRatchetTree)
	b := after(a, jsonEpochSecrets)
	c := after(b, jsonSecretTree)
	if c < 0 || !bytes.HasPrefix(raw[c+len(jsonSecretTree):], tree) {
		return nil
	}
	d := c + len(jsonSecretTree) + len(tree)
	if !bytes.HasPrefix(raw[d:], jsonMembers) {
		return nil
	}
	e := after(d, jsonCachedPSKs)
	if a <= 0 || e < 0 {
		return nil
	}
	return &stateJSON{
		g:       g,
		head:    slices.Clone(raw[:a]),
		tree:    unique.Make(string(raw[a:b])),
		secrets: slices.Clone(raw[b : c+len(jsonSecretTree)]),
		members: unique.Make(string(raw[d:e])),
		tail:    slices.Clone(raw[e:]),
	}
}

// splice returns the state's JSON with tree as its secret tree, between
// before and after.
func (j *stateJSON) splice(before, tree, after []byte) []byte {
	t, m := j.tree.Value(), j.members.Value()
	out := make([]byte, 0, len(before)+len(j.head)+len(t)+len(j.secrets)+len(tree)+len(m)+len(j.tail)+len(after))
	out = append(out, before...)
	out = append(out, j.head...)
	out = append(out, t...)
	out = append(out, j.secrets...)
	out = append(out, tree...)
	out = append(out, m...)
	out = append(out, j.tail...)
	return append(out, after...)
}
