package engine

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"unicode/utf8"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// editSnapshot returns snap with its mls-go state JSON changed by edit.
func editSnapshot(t testing.TB, snap []byte, edit func(state map[string]json.RawMessage)) []byte {
	t.Helper()
	var env snapshotEnvelope
	if err := json.Unmarshal(snap, &env); err != nil {
		t.Fatal(err)
	}
	var state map[string]json.RawMessage
	if err := json.Unmarshal(env.State, &state); err != nil {
		t.Fatal(err)
	}
	edit(state)
	var err error
	if env.State, err = json.Marshal(state); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// setJSON sets state[key] to v's JSON.
func setJSON(t testing.TB, state map[string]json.RawMessage, key string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	state[key] = b
}

// withTreeLeaves rewrites the ratchet tree's declared leaf count.
func withTreeLeaves(t testing.TB, snap []byte, leaves uint32) []byte {
	return editSnapshot(t, snap, func(state map[string]json.RawMessage) {
		var tree []byte
		if err := json.Unmarshal(state["ratchet_tree"], &tree); err != nil {
			t.Fatal(err)
		}
		binary.BigEndian.PutUint32(tree, leaves)
		setJSON(t, state, "ratchet_tree", tree)
	})
}

// damagedSnapshots returns snap damaged in every way the structural check
// covers, each naming what is wrong.
func damagedSnapshots(t testing.TB, snap []byte) map[string][]byte {
	out := map[string][]byte{
		"not json":   []byte("{"),
		"empty":      {},
		"no state":   []byte(`{"v":1}`),
		"version 2":  []byte(`{"v":2,"state":{}}`),
		"empty tree": []byte(`{"v":1,"state":{"cipher_suite":1,"epoch_secrets":{}}}`),
	}
	for name, leaves := range map[string]uint32{
		"zero leaves": 0, "leaves beyond the bytes": 1 << 14, "leaves beyond the bound": 1 << 20,
		"leaf count overflowing 32 bits": 0x80000000, "all-ones leaf count": 0xffffffff,
	} {
		out[name] = withTreeLeaves(t, snap, leaves)
	}
	edits := map[string]func(map[string]json.RawMessage){
		"truncated tree": func(s map[string]json.RawMessage) { setJSON(t, s, "ratchet_tree", []byte{0, 0, 0}) },
		"cipher suite":   func(s map[string]json.RawMessage) { setJSON(t, s, "cipher_suite", 7) },
		"no secrets":     func(s map[string]json.RawMessage) { delete(s, "epoch_secrets") },
		// FuzzRestore found a state without a secret tree and with an empty
		// encryption secret restoring to one that did not restore again.
		"no secret tree": func(s map[string]json.RawMessage) { delete(s, "secret_tree") },
		"secret tree without its secret": func(s map[string]json.RawMessage) {
			setJSON(t, s, "secret_tree", map[string]any{"encryption_secret": []byte{}, "leaf_count": 4})
		},
		"own leaf": func(s map[string]json.RawMessage) { setJSON(t, s, "own_leaf_index", 1<<20) },
		"member leaf": func(s map[string]json.RawMessage) {
			setJSON(t, s, "members", map[uint32]any{1 << 20: map[string]any{"active": true}})
		},
		"secret tree leaves": func(s map[string]json.RawMessage) {
			setJSON(t, s, "secret_tree", map[string]any{"encryption_secret": []byte{1}, "leaf_count": 1 << 30})
		},
		"path key node": func(s map[string]json.RawMessage) {
			setJSON(t, s, "path_node_priv_keys", map[uint32][]byte{1 << 20: {1}})
		},
		"psks": func(s map[string]json.RawMessage) {
			m := map[string][]byte{}
			for i := range maxSnapshotPSKs + 1 {
				m[fmt.Sprintf("psk-%d", i)] = []byte{1}
			}
			setJSON(t, s, "cached_psks", m)
		},
	}
	for name, edit := range edits {
		out[name] = editSnapshot(t, snap, edit)
	}
	return out
}

// TestRestoreRejectsDamagedSnapshot: a damaged snapshot of a 100-member
// group is storage loss (missing_history) found by the structural check,
// including leaf counts that made mls-go allocate the whole declared tree
// first (seconds, or all memory); the intact one restores.
func TestRestoreRejectsDamagedSnapshot(t *testing.T) {
	st, _ := benchGroup(t, 100)
	snap := must[[]byte](t)(st.Snapshot())
	back, err := Restore(snap)
	if err != nil || back.Epoch() != st.Epoch() || len(back.Members()) != 100 {
		t.Fatalf("intact snapshot: %v", err)
	}
	for name, b := range damagedSnapshots(t, snap) {
		got, err := Restore(b)
		if err == nil || got != nil {
			t.Fatalf("%s: restored", name)
		}
		if CategoryOf(err) != schema.CategoryMissingHistory || !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// Damage inside the structure is mls-go's to find (the tree hash).
	tree := editSnapshot(t, snap, func(s map[string]json.RawMessage) {
		var b []byte
		if err := json.Unmarshal(s["ratchet_tree"], &b); err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 1
		setJSON(t, s, "ratchet_tree", b)
	})
	if _, err := Restore(tree); CategoryOf(err) != schema.CategoryMissingHistory {
		t.Fatalf("damaged tree node: %v", err)
	}
}

// FuzzRestore: any bytes either restore to a state that snapshots and
// restores again at the same epoch, or fail with missing_history; nothing
// panics or runs unbounded.
func FuzzRestore(f *testing.F) {
	st, _ := benchGroup(f, 3)
	snap, err := st.Snapshot()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(snap)
	for _, b := range damagedSnapshots(f, snap) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := Restore(b)
		if err != nil {
			if CategoryOf(err) != schema.CategoryMissingHistory {
				t.Fatalf("restore error without missing_history: %v", err)
			}
			return
		}
		again, err := got.Snapshot()
		if err != nil {
			t.Fatalf("restored state does not snapshot: %v", err)
		}
		back, err := Restore(again)
		if err != nil || back.Epoch() != got.Epoch() || !slices.Equal(back.InboxIDs(), got.InboxIDs()) {
			t.Fatalf("restored state does not restore again: %v", err)
		}
	})
}

// TestChangesTrackSnapshot: a State whose change count is unchanged
// snapshots to the same bytes (what callers caching snapshots rely on), and
// every decryption, even one that fails, counts as a change.
func TestChangesTrackSnapshot(t *testing.T) {
	w := newWorld(t)
	before := must[[]byte](t)(w.state.Snapshot())
	n := w.state.Changes()
	upd := must[testpeer.Message](t)(w.alice.Commit())
	if _, _, err := w.state.ProcessHandshake(upd.MLS); err != nil {
		t.Fatal(err)
	}
	if _, err := w.state.GroupEventKey(); err != nil {
		t.Fatal(err)
	}
	if w.state.Changes() != n || !slices.Equal(must[[]byte](t)(w.state.Snapshot()), before) {
		t.Fatal("a non-mutating call changed the state or its count")
	}
	msg := must[testpeer.Message](t)(w.bob.SendText("hi"))
	if _, err := w.state.Decrypt(msg.MLS); err != nil {
		t.Fatal(err)
	}
	if w.state.Changes() != n+1 || slices.Equal(must[[]byte](t)(w.state.Snapshot()), before) {
		t.Fatal("a decryption advanced the ratchet without counting a change")
	}
	if _, err := w.state.Decrypt(msg.MLS); err == nil || w.state.Changes() != n+2 {
		t.Fatalf("a failed decryption was not counted: %v, %d changes", err, w.state.Changes()-n)
	}
}

// The snapshot envelope is spliced together rather than encoded by
// encoding/json: its bytes must be what encoding/json gives, for a state
// with own commits pending and sent messages as for one without.
func TestSnapshotEnvelopeAsJSONEncodesIt(t *testing.T) {
	w := newWorld(t)
	check := func(what string) {
		t.Helper()
		got, err := w.state.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		var env snapshotEnvelope
		if err := json.Unmarshal(got, &env); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		want, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("%s: the envelope differs from encoding/json's", what)
		}
		if _, err := Restore(got); err != nil {
			t.Fatalf("%s: restore: %v", what, err)
		}
	}
	check("joined")
	if _, err := w.state.Encrypt(w.hosted, []byte("sent")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.state.Commit(w.hosted, CommitRequest{}); err != nil {
		t.Fatal(err)
	}
	check("after a send and an own commit")
}

// TestSplicedStateIsMarshalState checks the state JSON a snapshot splices
// after decryptions against mls-go's own encoding of the same state (its
// cached PSKs left out, as the envelope holds them), and
// that a send, which moves more than the secret tree, is encoded again.
func TestSplicedStateIsMarshalState(t *testing.T) {
	st, ag, hosted := benchGroupHosted(t, 40)
	msgs := chatMessages(t, ag, 3)
	check := func(what string, wantCut bool) {
		t.Helper()
		got, err := st.marshalState(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		full, err := st.g.MarshalState()
		if err != nil {
			t.Fatal(err)
		}
		want, err := withoutCachedPSKs(full)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: the state's JSON differs from MarshalState's without its cached PSKs", what)
		}
		if j := st.json.Load(); (j != nil) != wantCut {
			t.Fatalf("%s: cut %v, want %v", what, j != nil, wantCut)
		}
	}
	check("joined", true)
	cut := st.json.Load()
	for i, m := range msgs {
		if _, err := st.Decrypt(m); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("after decryption %d", i), true)
	}
	if _, err := st.Decrypt(msgs[0]); err == nil {
		t.Fatal("a message decrypted twice")
	}
	check("after a failed decryption", true)
	if st.json.Load() != cut {
		t.Fatal("a decryption cut the state again")
	}
	snap, err := st.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(snap); err != nil {
		t.Fatal(err)
	}
	// Two states of the same epoch keep one copy of the public spans.
	c, err := st.Clone()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.marshalState(nil, nil); err != nil {
		t.Fatal(err)
	}
	if a, b := st.json.Load(), c.json.Load(); a.tree != b.tree || a.members != b.members {
		t.Fatal("the public spans are not shared")
	}
	if _, err := st.Encrypt(hosted, []byte("sent")); err != nil {
		t.Fatal(err)
	}
	check("after a send", true)
	if st.json.Load() == cut {
		t.Fatal("a send did not cut the state again")
	}
}

// A restored state snapshots to the bytes it was restored from and holds
// the PSKs of the state that took them, each once: mls-go's own JSON
// mangles the ids that are not UTF-8 (a resumption PSK's group id), and
// those must not come back beside the envelope's.
func TestRestoredStateSnapshotsToSameBytes(t *testing.T) {
	w := newWorld(t)
	psks := w.state.g.CachedPsks()
	if !slices.ContainsFunc(slices.Collect(maps.Keys(psks)), func(k string) bool { return !utf8.ValidString(k) }) {
		t.Fatal("no cached PSK whose id is not UTF-8")
	}
	snap := must[[]byte](t)(w.state.Snapshot())
	restored := must[*State](t)(Restore(snap))
	if !maps.EqualFunc(restored.g.CachedPsks(), psks, bytes.Equal) {
		t.Fatal("the restored state holds other PSKs")
	}
	if again := must[[]byte](t)(restored.Snapshot()); !bytes.Equal(again, snap) {
		t.Fatal("a restored state snapshots to other bytes")
	}
}

// Every epoch adds its resumption PSK to mls-go's cache (RFC 9420 §8.6),
// which mls-go never prunes. A member's snapshot keeps only the latest
// keptResumptionEpochs of them, so a member of a group hundreds of commits
// old still restores (Restore bounds a snapshot's PSKs at maxSnapshotPSKs)
// and its snapshot does not grow with the group's age.
func TestSnapshotOfAnOldGroupRestores(t *testing.T) {
	st, ag, _ := benchGroupHosted(t, 2)
	first := len(must[[]byte](t)(st.Snapshot()))
	for range maxSnapshotPSKs + 44 {
		commit := must[testpeer.Message](t)(ag.Commit())
		next, _, err := st.ProcessHandshake(commit.MLS)
		if err != nil {
			t.Fatalf("epoch %d: %v", st.Epoch(), err)
		}
		st = next
	}
	snap := must[[]byte](t)(st.Snapshot())
	restored, err := Restore(snap)
	if err != nil {
		t.Fatalf("restore a member at epoch %d: %v", st.Epoch(), err)
	}
	if restored.Epoch() != st.Epoch() {
		t.Fatalf("restored epoch %d, want %d", restored.Epoch(), st.Epoch())
	}
	var env snapshotEnvelope
	if err := json.Unmarshal(snap, &env); err != nil {
		t.Fatal(err)
	}
	if len(env.PSKs) > keptResumptionEpochs {
		t.Fatalf("the snapshot holds %d PSKs, want at most %d", len(env.PSKs), keptResumptionEpochs)
	}
	if n := len(snap); n > 2*first {
		t.Fatalf("the snapshot grew from %d to %d bytes over %d epochs", first, n, maxSnapshotPSKs+44)
	}
	// The restored member follows the group on.
	commit := must[testpeer.Message](t)(ag.Commit())
	if _, _, err := restored.ProcessHandshake(commit.MLS); err != nil {
		t.Fatalf("the restored member processes the next commit: %v", err)
	}
}

// Issue 26 item 1: removing the member of the last leaf truncates the tree,
// and mls-go keeps the removed member, inactive, past it. The state's
// snapshot restores (it was refused as "2 members for 1 leaves", so a
// member restored cold had no state and converge panicked), and the
// restored state sends on; an active member past the tree is still refused.
func TestSnapshotAfterLastLeafRemovedRestores(t *testing.T) {
	h := newHostedGroup(t, components.Set{}, "bob")
	out, err := h.state.Commit(h.inst, CommitRequest{Remove: []string{h.peers[0].Peer().InboxID()}})
	if err != nil {
		t.Fatal(err)
	}
	h.accept(t, out.Commit)
	snap := must[[]byte](t)(h.state.Snapshot())
	restored, err := Restore(snap)
	if err != nil {
		t.Fatalf("restore after the last leaf's removal: %v", err)
	}
	if restored.Epoch() != h.state.Epoch() || len(restored.Members()) != 1 {
		t.Fatalf("restored epoch %d members %d", restored.Epoch(), len(restored.Members()))
	}
	if _, err := restored.Encrypt(h.inst, encode(t, apppayload.NewText("alone"))); err != nil {
		t.Fatalf("the restored state sends: %v", err)
	}
	active := editSnapshot(t, snap, func(s map[string]json.RawMessage) {
		setJSON(t, s, "members", map[uint32]any{0: map[string]any{"active": true}, 1: map[string]any{"active": true}})
	})
	if _, err := Restore(active); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("an active member past the tree: %v", err)
	}
}
