package converge

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/testpeer"
)

// A state blob larger than one message is stored as parts behind a
// manifest, read back whole, and purged with its parts.
func TestLargeBlobStoredInParts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	w, err := New(e.ctx, Config{JS: e.js, MLS: EngineMLS{Vault: e.vault}, WorkerID: "parts", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	w.partBytes = 1000
	big := make([]byte, 3500)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	small := []byte("small state")
	bigKey := must[string](t)(blobKey(tenant, "0a", "c1"))
	smallKey := must[string](t)(blobKey(tenant, "0a", ""))
	written, parts, err := w.putBlobs(e.ctx, map[string][]byte{bigKey: big, smallKey: small})
	if err != nil {
		t.Fatal(err)
	}
	if parts[bigKey] != 4 || parts[smallKey] != 0 {
		t.Fatalf("parts = %v, want 4 for the large blob only", parts)
	}
	want := []string{bigKey, smallKey, partKey(bigKey, 0), partKey(bigKey, 1), partKey(bigKey, 2), partKey(bigKey, 3)}
	if !sameKeys(written, want) {
		t.Fatalf("written %v, want %v", written, want)
	}
	for k, b := range map[string][]byte{bigKey: big, smallKey: small} {
		got, err := w.getBlob(e.ctx, k)
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("blob %s read back as %d bytes (%v), want %d", k, len(got), err, len(b))
		}
	}
	for _, k := range written {
		if blobOf(k) != bigKey && blobOf(k) != smallKey {
			t.Fatalf("blobOf(%s) = %s", k, blobOf(k))
		}
	}
	w.purge(e.ctx, written)
	eventually.NoError(t, func() error {
		left := 0
		for _, k := range written {
			if _, err := w.conv.Get(e.ctx, k); !errors.Is(err, jetstream.ErrKeyNotFound) {
				left++
			}
		}
		if left > 0 {
			return fmt.Errorf("%d of %d keys left after the purge", left, len(written))
		}
		return nil
	})
}

func sameKeys(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// A worker that stored a member's state in parts hands the group over: the
// next worker reads the parts and goes on, emitting nothing twice.
func TestMemberStateInPartsSurvivesHandover(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	w1, err := New(e.ctx, Config{JS: e.js, MLS: EngineMLS{Vault: e.vault}, WorkerID: "w1", LeaseTTL: 1500 * time.Millisecond, CleanupInterval: 200 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	w1.partBytes = 2048 // every member state is larger
	ctx, cancel := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := w1.Run(ctx); err != nil {
			t.Error(err)
		}
	})
	g, welcome := e.invited(peer(t, "alice"), h)
	e.publish(welcome)
	for i := range 5 {
		e.publish(must[testpeer.Message](t)(g.SendText(string(rune('a' + i)))))
	}
	e.waitEvents(h.rec.ClientID, 6)
	ck, _, err := readCheckpoint(e.ctx, e.js, tenant, hex.EncodeToString(g.ID()))
	if err != nil {
		t.Fatal(err)
	}
	if ck.Parts[ck.Members[sharedKey]] < 2 {
		t.Fatalf("the member's state was not stored in parts: %v", ck.Parts)
	}
	cancel()
	wg.Wait()

	e.worker("w2", nil)
	last := must[testpeer.Message](t)(g.SendText("after the handover"))
	e.publish(last)
	evs := e.waitEvents(h.rec.ClientID, 7)
	if len(evs) != 7 {
		t.Fatalf("%d events, want 7", len(evs))
	}
	if r := evs[6].Event.MessageReceived; r == nil || !r.MessageID.Equal(last.ID) {
		t.Fatalf("last event %s, want the message after the handover", describe(evs[6].Event))
	}
}

// A member's settled messages are stored in chunk blobs written once: a
// later transaction names the same blobs for the chunks it did not change,
// the member's own blob stays small, and the next worker restores the
// member from both and goes on.
func TestMemberChunksWrittenOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	g, welcome := e.invited(peer(t, "alice"), h)
	_, stop := e.worker("w1", nil)
	e.publish(welcome)
	const n = 600 // more than two chunks of 256 settled messages
	for i := range n {
		e.publish(must[testpeer.Message](t)(g.SendText(benchText(i))))
	}
	e.waitEvents(h.rec.ClientID, n+1)
	groupHex := hex.EncodeToString(g.ID())
	ck1, _, err := readCheckpoint(e.ctx, e.js, tenant, groupHex)
	if err != nil {
		t.Fatal(err)
	}
	first := ck1.MemberChunks[sharedKey]
	if len(first) < 2 {
		t.Fatalf("member chunks %v for %d settled messages", first, n)
	}
	for i := range 3 {
		e.publish(must[testpeer.Message](t)(g.SendText(benchText(n + i))))
	}
	e.waitEvents(h.rec.ClientID, n+4)
	ck2, _, err := readCheckpoint(e.ctx, e.js, tenant, groupHex)
	if err != nil {
		t.Fatal(err)
	}
	later := ck2.MemberChunks[sharedKey]
	if len(later) < len(first) || !slices.Equal(later[:len(first)-1], first[:len(first)-1]) {
		t.Fatalf("full chunks stored again: %v then %v", first, later)
	}
	w, err := New(e.ctx, Config{JS: e.js, MLS: EngineMLS{Vault: e.vault}, WorkerID: "reader", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	head, err := w.getBlob(e.ctx, ck2.Members[sharedKey])
	if err != nil {
		t.Fatal(err)
	}
	if len(head) > 16<<10 {
		t.Fatalf("the member's own blob is %d bytes after %d messages", len(head), n+3)
	}
	stop()

	e.worker("w2", nil)
	last := must[testpeer.Message](t)(g.SendText("after the handover"))
	e.publish(last)
	evs := e.waitEvents(h.rec.ClientID, n+5)
	if r := evs[n+4].Event.MessageReceived; r == nil || !r.MessageID.Equal(last.ID) {
		t.Fatalf("last event %s, want the message after the handover", describe(evs[n+4].Event))
	}
}
