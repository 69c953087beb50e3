package converge

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

var fullSizeGroup = flag.Bool("converge-3000", false, "run TestOneInputNeverHoldsAPartition with 3,000 hosted members at the default -max-batch (1000) instead of 24 at -max-batch 10")

// TestOneInputNeverHoldsAPartition: an input whose events exceed one
// atomic batch (a Welcome to more hosted members than -max-batch allows,
// then a message to all of them) is committed in several batches, not
// refused and retried for ever: the partition goes on to the next input.
// A worker that fails between two of those batches (as a crash does)
// leaves the rest to its retry, which stores it once: every member gets
// each event exactly once, in order (EVENT-001). The failure shows as a
// retried input.
//
// The suite runs 24 hosted members at -max-batch 10 (the same cuts, three
// batches per input); -converge-3000 runs 3,000 at the default 1000.
func TestOneInputNeverHoldsAPartition(t *testing.T) {
	n, maxBatch, within := 24, 10, time.Minute
	if *fullSizeGroup {
		// Joins cost more than linearly in the members (200 took 14 s
		// on the 2-core development machine, 400 more than a minute).
		n, maxBatch, within = 3000, bus.DefaultMaxBatch, 3*time.Hour
	}
	e := newEnvWithin(t, within+time.Minute)
	hs := make([]hosted, n)
	kps := make([][]byte, n)
	for i := range hs {
		hs[i] = e.register(sha256.Sum256(fmt.Appendf(nil, "member %d", i)), 1)
		kps[i] = hs[i].kps[0]
	}
	alice := peer(t, "alice")
	g := must[*testpeer.Group](t)(alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}}))
	_, welcome, err := g.Invite(kps...)
	if err != nil {
		t.Fatal(err)
	}
	m := must[testpeer.Message](t)(g.SendText("to everyone"))

	var failed atomic.Bool
	drainHook = func() error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("crash between two batches of one input")
		}
		return nil
	}
	t.Cleanup(func() { drainHook = nil })
	metrics := NewMetrics(nil)
	e.worker("w1", func(c *Config) { c.MaxBatch, c.Metrics = maxBatch, metrics })
	e.publish(welcome)
	e.publish(m)
	for _, h := range []hosted{hs[0], hs[n/2], hs[n-1]} {
		evs := e.waitEventsWithin(h.rec.ClientID, 2, within)
		uniqueIDs(t, evs)
		if evs[0].Event.Kind != schema.KindConversationJoined || evs[1].Event.MessageReceived == nil || !evs[1].Event.MessageReceived.MessageID.Equal(m.ID) {
			t.Fatalf("events %v, want joined then the message", kinds(evs))
		}
	}
	if o := e.settledOutcome(m.ID); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("message outcome %+v", o)
	}
	if !failed.Load() || testutil.ToFloat64(metrics.Retries) == 0 {
		t.Fatal("the failure between batches was not retried")
	}
	// Every member, not only those checked above, got both.
	for _, h := range hs {
		if evs := e.events(h.rec.ClientID); len(evs) != 2 {
			t.Fatalf("a member has %d events, want 2", len(evs))
		}
	}
}
