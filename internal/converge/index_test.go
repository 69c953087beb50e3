package converge

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// A version 2 index: full chunks in blobs and an inline tail.
func legacyIndex(t *testing.T, n int) (*groupState, []chunkRef, map[string][]byte) {
	t.Helper()
	g := newGroupState(tenant, []byte{0x0a})
	g.V = 2
	blobs := map[string][]byte{}
	var refs []chunkRef
	for c := 0; (c+1)*messageChunkLen <= n; c++ {
		mc := messageChunk{First: uint64(c * messageChunkLen)}
		for i := c * messageChunkLen; i < (c+1)*messageChunkLen; i++ {
			mc.Messages = append(mc.Messages, indexed(i))
		}
		key := fmt.Sprintf("acme.0a.i.%d", c)
		blobs[key] = must[[]byte](t)(msgpack.Marshal(mc))
		refs = append(refs, chunkRef{N: uint64(c), Key: key})
	}
	for i := len(refs) * messageChunkLen; i < n; i++ {
		g.Messages = append(g.Messages, indexed(i))
	}
	return g, refs, blobs
}

func indexed(n int) storedMessage {
	id := sha256.Sum256([]byte(fmt.Sprintf("message-%05d", n)))
	return storedMessage{ID: id[:], SenderInboxID: "ab", Seq: uint64(n)}
}

// A version 2 index is read back from its chunks in order; a chunk that
// does not hold the ordinals its place says is refused, not read into the
// wrong place.
func TestLegacyIndexRead(t *testing.T) {
	t.Parallel()
	g, refs, blobs := legacyIndex(t, 2*messageChunkLen+5)
	get := func(k string) ([]byte, error) { return blobs[k], nil }
	swapped := []chunkRef{{N: 0, Key: refs[1].Key}, {N: 1, Key: refs[0].Key}}
	if err := must[*groupState](t)(g.clone()).loadLegacyIndex(swapped, get); err == nil {
		t.Fatal("chunks read into each other's places")
	}
	if err := must[*groupState](t)(g.clone()).loadLegacyIndex(refs[1:], get); err == nil {
		t.Fatal("a missing first chunk went unnoticed")
	}
	if err := g.loadLegacyIndex(refs, get); err != nil {
		t.Fatal(err)
	}
	for i, m := range g.Messages {
		if !bytes.Equal(m.ID, indexed(i).ID) {
			t.Fatalf("entry %d read back out of place", i)
		}
	}
}

// A busy group's index is stored, not held in its state: after hundreds of
// messages the group state blob holds no message, and the oldest message
// is still found by a deletion that a fresh worker applies.
func TestBusyGroupIndexSurvivesHandover(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	alice := peer(t, "alice")
	h := e.register(peer(t, "bob").AccountID(), 1)
	g, welcome := e.invited(alice, h)
	_, stop := e.worker("first", nil)
	e.publish(welcome)
	const n = 2*messageChunkLen + 10
	var first testpeer.Message
	for i := range n {
		m := must[testpeer.Message](t)(g.SendText(fmt.Sprintf("message %d", i)))
		if i == 0 {
			first = m
		}
		e.publish(m)
	}
	e.waitEvents(h.rec.ClientID, n+1) // conversation.joined and n messages
	stop()

	ck, _, err := readCheckpoint(e.ctx, e.js, tenant, fmt.Sprintf("%x", g.ID()))
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(e.ctx, Config{JS: e.js, MLS: EngineMLS{Vault: e.vault}, WorkerID: "reader", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	state, err := w.getBlob(e.ctx, ck.State)
	if err != nil {
		t.Fatal(err)
	}
	gs := must[*groupState](t)(decodeGroupState(state))
	if len(gs.Messages) != 0 || gs.V != stateVersion {
		t.Fatalf("group state blob version %d holds %d messages", gs.V, len(gs.Messages))
	}

	_, stop = e.worker("second", nil)
	defer stop()
	del := must[testpeer.Message](t)(g.SendDelete(first.ID))
	e.publish(del)
	evs := e.waitEvents(h.rec.ClientID, n+3)
	last := evs[len(evs)-1].Event
	if last.Kind != schema.KindMessageDeleted || !bytes.Equal(last.MessageDeleted.MessageID, first.ID) {
		t.Fatalf("last event %+v, want message.deleted of the first message", last)
	}
	if o := e.settledOutcome(del.ID); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("deletion outcome %+v", o)
	}
}

// A version 2 index moves into the stored index: every entry not deleted
// is found, the deleted one is not, those awaiting expiry are in one page
// sorted by expiry, and the state keeps none of them. Moving it again (a
// crash before the transaction that follows committed) changes nothing.
func TestLegacyIndexMigrated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	w := must[*Worker](t)(New(e.ctx, Config{JS: e.js, MLS: EngineMLS{Vault: e.vault}, WorkerID: "migrate", Logger: quiet()}))
	const n = messageChunkLen + 3
	g, refs, blobs := legacyIndex(t, n)
	if err := g.loadLegacyIndex(refs, func(k string) ([]byte, error) { return blobs[k], nil }); err != nil {
		t.Fatal(err)
	}
	g.Messages[3].Deleted = true
	g.Messages[5].ExpiresAt, g.Messages[4].ExpiresAt = 2000, 3000
	again := must[*groupState](t)(g.clone())
	if err := w.migrateIndex(e.ctx, tenant, "0a", g); err != nil {
		t.Fatal(err)
	}
	if err := w.migrateIndex(e.ctx, tenant, "0a", again); err != nil {
		t.Fatalf("second migration: %v", err)
	}
	if len(g.Messages) != 0 || g.nextExpiry() != 2000 {
		t.Fatalf("state keeps %d messages, next expiry %d", len(g.Messages), g.nextExpiry())
	}
	for i := range n {
		s, err := w.readEntry(e.ctx, tenant, "0a", indexed(i).ID)
		if err != nil {
			t.Fatal(err)
		}
		if (s == nil) != (i == 3) {
			t.Fatalf("entry %d found %v", i, s != nil)
		}
	}
	page, seq, err := w.readPage(e.ctx, tenant, "0a", legacySecs, 1)
	if err != nil || seq == 0 || len(page) != 2 || !bytes.Equal(page[0].ID, indexed(5).ID) {
		t.Fatalf("legacy page %v at %d: %v", page, seq, err)
	}
	if _, next, err := w.readPage(e.ctx, tenant, "0a", legacySecs, seq+1); next != 0 || err != nil {
		t.Fatalf("a second legacy page at %d: %v", next, err)
	}
}
