package converge

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// indexStore stores the message index of g as prepare does and reads it
// back as load does, through the blobs map.
func indexStore(t *testing.T, g *groupState, prev []chunkRef, blobs map[string][]byte) ([]chunkRef, map[string][]byte, *groupState) {
	t.Helper()
	refs, written, stored, err := g.storeIndex(tenant, "0a", prev)
	if err != nil {
		t.Fatal(err)
	}
	for k, b := range written {
		blobs[k] = b
	}
	b := must[[]byte](t)(stored.encode())
	back := must[*groupState](t)(decodeGroupState(b))
	if err := back.loadIndex(refs, func(k string) ([]byte, error) {
		if b, ok := blobs[k]; ok {
			return b, nil
		}
		return nil, fmt.Errorf("no blob %s", k)
	}); err != nil {
		t.Fatal(err)
	}
	return refs, written, back
}

func indexed(n int) storedMessage {
	return storedMessage{ID: []byte(fmt.Sprintf("message-%05d", n)), SenderInboxID: "ab", Seq: uint64(n)}
}

// The index is stored as full chunks written once plus an inline tail; a
// deletion rewrites only its chunk, and dropping the oldest entries beyond
// maxMessages keeps the ordinals of the rest.
func TestMessageIndexStoredInChunks(t *testing.T) {
	g := newGroupState(tenant, []byte{0x0a})
	blobs := map[string][]byte{}
	for i := range 300 {
		g.addMessage(indexed(i))
	}
	refs, written, back := indexStore(t, g, nil, blobs)
	if len(refs) != 2 || len(written) != 2 {
		t.Fatalf("300 messages: %d chunks, %d written; want 2 full chunks", len(refs), len(written))
	}
	if !slices.EqualFunc(back.Messages, g.Messages, func(a, b storedMessage) bool { return bytes.Equal(a.ID, b.ID) }) {
		t.Fatal("index read back differs")
	}
	if _, _, stored := must3(t)(g.storeIndex(tenant, "0a", refs)); len(stored.Messages) != 300-2*messageChunkLen {
		t.Fatalf("inline entries %d, want %d", len(stored.Messages), 300-2*messageChunkLen)
	}

	// Nothing changed: nothing is written again.
	if _, written, _ := indexStore(t, g, refs, blobs); len(written) != 0 {
		t.Fatalf("unchanged index wrote %d chunks", len(written))
	}

	// A deletion in chunk 0 rewrites chunk 0 only.
	g.deleteMessage(g.messageIndex(indexed(5).ID))
	refs2, written, back := indexStore(t, g, refs, blobs)
	if len(written) != 1 || refs2[0].Key == refs[0].Key || refs2[1].Key != refs[1].Key {
		t.Fatalf("deletion in chunk 0 wrote %d chunks: %v then %v", len(written), refs, refs2)
	}
	if !back.message(indexed(5).ID).Deleted || back.message(indexed(6).ID).Deleted {
		t.Fatal("the deletion did not survive, or spread")
	}

	// Past maxMessages the oldest go; the chunks that held only them are
	// no longer named, and a partly dropped chunk is read from its ordinal.
	for i := 300; i < maxMessages+200; i++ {
		g.addMessage(indexed(i))
	}
	refs3, _, back := indexStore(t, g, refs2, blobs)
	if g.MessageBase != 200 || len(back.Messages) != maxMessages || !bytes.Equal(back.Messages[0].ID, indexed(200).ID) {
		t.Fatalf("base %d, %d entries read back starting %q", g.MessageBase, len(back.Messages), back.Messages[0].ID)
	}
	if refs3[0].N != 1 || refs3[0].Key != refs2[1].Key {
		t.Fatalf("chunks after the drop %v: want chunk 1 kept as stored, chunk 0 gone", refs3[:2])
	}
	back.addMessage(indexed(maxMessages + 200))
	if back.MessageBase != 201 {
		t.Fatalf("base read back %d", back.MessageBase)
	}
}

// A chunk that does not hold the ordinals its place says is refused, not
// read into the wrong place.
func TestMessageChunkMismatchRefused(t *testing.T) {
	g := newGroupState(tenant, []byte{0x0a})
	for i := range 2 * messageChunkLen {
		g.addMessage(indexed(i))
	}
	refs, blobs, stored := must3(t)(g.storeIndex(tenant, "0a", nil))
	get := func(k string) ([]byte, error) { return blobs[k], nil }
	swapped := []chunkRef{{N: 0, Key: refs[1].Key}, {N: 1, Key: refs[0].Key}}
	if err := stored.loadIndex(swapped, get); err == nil {
		t.Fatal("chunks read into each other's places")
	}
	if err := stored.loadIndex(refs[1:], get); err == nil {
		t.Fatal("a missing first chunk went unnoticed")
	}
}

func must3(t *testing.T) func([]chunkRef, map[string][]byte, *groupState, error) ([]chunkRef, map[string][]byte, *groupState) {
	return func(r []chunkRef, b map[string][]byte, g *groupState, err error) ([]chunkRef, map[string][]byte, *groupState) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return r, b, g
	}
}

// A busy group's transactions write the index chunks once: after hundreds
// of messages the group state blob holds only the entries after the last
// full chunk, and a message in a stored chunk is still found by a
// deletion that a fresh worker (reading everything back) applies.
func TestBusyGroupIndexSurvivesHandover(t *testing.T) {
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
	if len(ck.Chunks) != 2 {
		t.Fatalf("checkpoint names %d chunks, want 2", len(ck.Chunks))
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
	if len(gs.Messages) != n-2*messageChunkLen {
		t.Fatalf("group state blob holds %d messages inline, want %d", len(gs.Messages), n-2*messageChunkLen)
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
