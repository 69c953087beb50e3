package converge

import (
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Once a join is stored, the KeyPackage it used is retired (Marmot
// joining.md steps 11–12): its private keys leave the client's sealed
// installation and its index entry goes, so a second Welcome to the same
// KeyPackage joins nobody. The client's other KeyPackages stay.
func TestJoinRetiresItsKeyPackage(t *testing.T) {
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 2)
	e.worker("w1", nil)
	used, err := engine.KeyPackageRef(h.kps[0])
	if err != nil {
		t.Fatal(err)
	}
	kept, err := engine.KeyPackageRef(h.kps[1])
	if err != nil {
		t.Fatal(err)
	}

	_, welcome := e.invited(peer(t, "alice"), h)
	e.publish(welcome)
	e.waitEvents(h.rec.ClientID, 1)
	if o := e.settledOutcome(welcome.ID); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("welcome: %+v", o)
	}

	retired := func() bool {
		rec, err := e.store.Lookup(e.ctx, tenant, h.rec.ClientID)
		if err != nil {
			t.Fatal(err)
		}
		inst, err := e.vault.Open(rec.Installation)
		if err != nil {
			t.Fatal(err)
		}
		_, held := inst.KeyPackageMessage(used)
		_, err = clientstore.LookupKeyPackage(e.ctx, e.store.Clients(), tenant, hex.EncodeToString(used))
		return !held && errors.Is(err, clientstore.ErrNotFound)
	}
	for deadline := time.Now().Add(10 * time.Second); !retired(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the used KeyPackage is still held or indexed")
		}
	}
	if id, err := clientstore.LookupKeyPackage(e.ctx, e.store.Clients(), tenant, hex.EncodeToString(kept)); err != nil || id != h.rec.ClientID {
		t.Fatalf("the unused KeyPackage's index: %q %v", id, err)
	}

	// Another group invites the same KeyPackage: nobody hosted holds it.
	_, again := e.invited(peer(t, "carol"), h)
	e.publish(again)
	if o := e.settledOutcome(again.ID); o.Status != schema.StatusRejected || o.Category != schema.CategoryWrongRecipient {
		t.Fatalf("second Welcome to a retired KeyPackage: %+v", o)
	}
	if evs := e.waitEvents(h.rec.ClientID, 1); len(evs) != 1 {
		t.Fatalf("%d events, want only the first join", len(evs))
	}
}
