package converge

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// TestGroupEventKeysSealedAtRest: a group event key peels every sealed
// transport message of its group, so neither the fabric-group-keys value
// nor converge's state record holds one in the clear; they hold it sealed
// under the master key, and ingest still peels a sealed message with it.
func TestGroupEventKeysSealedAtRest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	submit := e.startIngest()
	h := e.register(peer(t, "bob").AccountID(), 1)
	w, stop := e.worker("w1", nil)
	defer stop()
	g, welcome := e.invited(peer(t, "alice"), h)
	e.publish(welcome)
	e.waitEvents(h.rec.ClientID, 1)

	g.SetSealed(true)
	m := must[testpeer.Message](t)(g.SendText("sealed"))
	if r := submit(m.Transport); r.Status == schema.StatusRejected {
		t.Fatalf("sealed message rejected: %+v", r)
	}
	if r := e.waitEvents(h.rec.ClientID, 2)[1].Event.MessageReceived; r == nil || !r.MessageID.Equal(m.ID) {
		t.Fatal("ingest did not peel the sealed message with the stored keys")
	}
	want := g.EventKeys()[len(g.EventKeys())-1]

	groupHex := hex.EncodeToString(g.ID())
	key := must[string](t)(subject.GroupKey(tenant, groupHex))
	kv := must[jetstream.KeyValue](t)(e.js.KeyValue(e.ctx, streams.BucketGroupKeys))
	stored := must[jetstream.KeyValueEntry](t)(kv.Get(e.ctx, key)).Value()
	ck, _, err := readCheckpoint(e.ctx, e.js, tenant, groupHex)
	if err != nil {
		t.Fatal(err)
	}
	state := must[[]byte](t)(w.getBlob(e.ctx, ck.State))
	for name, b := range map[string][]byte{"fabric-group-keys value": stored, "state record": state} {
		if bytes.Contains(b, want[:]) {
			t.Errorf("the %s holds the group event key in the clear", name)
		}
	}

	keys, err := bus.OpenGroupKeys(e.vault, stored)
	if err != nil || len(keys) == 0 || keys[0] != want {
		t.Fatalf("fabric-group-keys value opens to %d keys (%v), want the current key first", len(keys), err)
	}
	gs := must[*groupState](t)(decodeGroupState(state))
	opened, err := openKeys(e.vault, gs.Keys)
	if err != nil || len(opened) == 0 || !bytes.Equal(opened[len(opened)-1].Key, want[:]) {
		t.Fatalf("state record keys open to %d keys (%v), want the current key last", len(opened), err)
	}
}
