package converge

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"

	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Once a join is stored, the KeyPackage it used is retired (Marmot
// joining.md steps 11–12): its private keys leave the client's sealed
// installation and its index entry goes, so a second Welcome to the same
// KeyPackage joins nobody. The client's other KeyPackages stay.
func TestJoinRetiresItsKeyPackage(t *testing.T) {
	t.Parallel()
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
		inst := e.installation(h.rec.ClientID)
		_, held := inst.KeyPackageMessage(used)
		_, err := clientstore.LookupKeyPackage(e.ctx, e.store.Clients(), tenant, hex.EncodeToString(used))
		return !held && errors.Is(err, clientstore.ErrNotFound)
	}
	eventually.True(t, "the used KeyPackage is neither held nor indexed", retired)
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

// Issue 19: a KeyPackage pool that refills itself when a join consumes
// one. With a pool of three, the client's one KeyPackage is consumed by a
// join and the client holds three fresh ones again, each routed to it; a
// Welcome of another group to one of them joins the client too.
func TestJoinRefillsKeyPackagePool(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.register(peer(t, "bob").AccountID(), 1)
	const pool = 3
	e.worker("w1", func(c *Config) { c.KeyPackagePool = pool })
	used := must[[]byte](t)(engine.KeyPackageRef(h.kps[0]))

	_, welcome := e.invited(peer(t, "alice"), h)
	e.publish(welcome)
	e.waitEvents(h.rec.ClientID, 1)
	held := func() [][]byte {
		inst := e.installation(h.rec.ClientID)
		var kps [][]byte
		for _, ref := range inst.KeyPackageRefs() {
			if bytes.Equal(ref, used) {
				return nil
			}
			kp, _ := inst.KeyPackageMessage(ref)
			kps = append(kps, kp)
		}
		return kps
	}
	var fresh [][]byte
	eventually.NoError(t, func() error {
		if fresh = held(); len(fresh) != pool {
			return fmt.Errorf("the client holds %d KeyPackages after the join, want the pool's %d without the used one", len(fresh), pool)
		}
		return nil
	})
	for _, kp := range fresh {
		ref := must[[]byte](t)(engine.KeyPackageRef(kp))
		if id, err := clientstore.LookupKeyPackage(e.ctx, e.store.Clients(), tenant, hex.EncodeToString(ref)); err != nil || id != h.rec.ClientID {
			t.Fatalf("a fresh KeyPackage's index: %q %v", id, err)
		}
	}

	// A second group invites one of the fresh KeyPackages.
	second := hosted{rec: h.rec, kps: fresh[1:2]}
	_, again := e.invited(peer(t, "carol"), second)
	e.publish(again)
	if o := e.settledOutcome(again.ID); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("Welcome to a fresh KeyPackage: %+v", o)
	}
	if j := e.waitEvents(h.rec.ClientID, 2)[1].Event.ConversationJoined; j == nil || j.Origin != schema.OriginWelcomed {
		t.Fatal("the client did not join from the Welcome to a fresh KeyPackage")
	}
}

// installation opens the installation the client store holds for a client.
func (e *env) installation(clientID string) *engine.Installation {
	e.t.Helper()
	rec, err := e.store.Lookup(e.ctx, tenant, clientID)
	if err != nil {
		e.t.Fatal(err)
	}
	inst, err := e.vault.Open(rec.Installation)
	if err != nil {
		e.t.Fatal(err)
	}
	return inst
}
