package converge

import (
	"bytes"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// A group idle past Config.IdleAfter leaves memory (a cold member is not
// resident, issue 21), and the next input restores its member from the
// stored state: the messages before and after the eviction are each
// received once (EVENT-001), in order. With snapshots every 4th
// transaction the stored state is older than the evicted one, so the
// restored member ratchets forward from it, as after a restart. Each
// eviction returns the freed memory to the system, once: the worker's
// clock passes IdleAfter only when the test moves it.
func TestIdleGroupIsRestoredOnDemand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := NewMetrics(nil)
	clock := &testClock{}
	h := e.register(peer(t, "bob").AccountID(), 1)
	w, _ := e.worker("w1", func(c *Config) { c.Metrics, c.Now, c.IdleAfter, c.SnapshotEvery = m, clock.Now, time.Hour, 4 })
	_, g := groupWithHosted(t, e, components.Set{}, h)
	e.waitEvents(h.rec.ClientID, 1)
	texts := []string{"before", "after one eviction", "after two"}
	for i, text := range texts {
		if i > 0 {
			e.goIdle(w, clock, i)
			if got := testutil.ToFloat64(m.MemoryReleases); got != float64(i) {
				t.Fatalf("after eviction %d: %v memory releases", i, got)
			}
		}
		msg := must[testpeer.Message](t)(g.SendText(text))
		e.publish(msg)
		evs := e.waitEvents(h.rec.ClientID, i+2)
		got := evs[i+1].Event
		if got.Kind != schema.KindMessageReceived || got.MessageReceived == nil || !bytes.Equal(got.MessageReceived.MessageID, msg.ID) {
			t.Fatalf("event %d: %+v", i+1, got)
		}
	}
}

// The memory of dropped idle groups is returned to the system at most once
// per IdleAfter (issue 21): a drop within the period of the last release
// waits for its end, and polls with nothing dropped release nothing.
func TestMemoryReleasedAtMostOncePerIdlePeriod(t *testing.T) {
	t.Parallel()
	const period = time.Minute
	r := newMemoryRelease(period)
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	for i, step := range []struct {
		at      time.Duration
		dropped bool
		release bool
	}{
		{0, false, false},                   // nothing dropped yet
		{time.Second, true, true},           // the first drop releases at once
		{2 * time.Second, true, false},      // within the period: held back
		{period, false, false},              // still within it
		{period + time.Second, false, true}, // its end releases what was held back
		{3 * period, false, false},          // nothing dropped since
		{3 * period, true, true},
	} {
		r.poll(t0.Add(step.at), step.dropped)
		released := false
		select {
		case <-r.due:
			released = true
		default:
		}
		if released != step.release {
			t.Errorf("step %d (%v, dropped %v): released %v, want %v", i, step.at, step.dropped, released, step.release)
		}
	}
}
