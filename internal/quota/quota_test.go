package quota

import (
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

// A tenant past its burst is refused with the time its bucket needs,
// while another tenant's bucket is untouched; the refusal takes nothing.
func TestBucketsRefusePastBurstPerTenant(t *testing.T) {
	b := NewBuckets(10, 20)
	if ok, _ := b.Take("a", 20, t0); !ok {
		t.Fatal("a burst refused")
	}
	ok, wait := b.Take("a", 1, t0)
	if ok || wait != 100*time.Millisecond {
		t.Fatalf("past the burst: ok %v, retry after %v, want refused, 100ms", ok, wait)
	}
	if ok, _ := b.Take("b", 20, t0); !ok {
		t.Fatal("another tenant refused")
	}
	if ok, _ := b.Take("a", 1, t0.Add(100*time.Millisecond)); !ok {
		t.Fatal("refused after the wait it was told")
	}
	if ok, _ := b.Take("a", 21, t0.Add(time.Hour)); ok {
		t.Fatal("more than a burst at once")
	}
	var off *Buckets = NewBuckets(0, 5)
	if ok, _ := off.Take("a", 1<<30, t0); !ok || off.Burst() != 0 {
		t.Fatal("no rate is no limit")
	}
}

// A cost known afterwards (Charge) may put a bucket in debt, at most a
// burst; Ready refuses until it is paid off.
func TestBucketsChargeIntoDebt(t *testing.T) {
	b := NewBuckets(100, 100)
	if ok, _ := b.Ready("a", t0); !ok {
		t.Fatal("a full bucket not ready")
	}
	b.Charge("a", 1000, t0) // capped at the burst: 100 tokens
	if ok, wait := b.Ready("a", t0); ok || wait != 10*time.Millisecond {
		t.Fatalf("empty bucket: ready %v after %v", ok, wait)
	}
	b.Charge("a", 100, t0) // 100 in debt
	if ok, wait := b.Ready("a", t0.Add(time.Second)); ok || wait != 10*time.Millisecond {
		t.Fatalf("in debt: ready %v, wait %v", ok, wait)
	}
	if ok, _ := b.Ready("a", t0.Add(1010*time.Millisecond)); !ok {
		t.Fatal("not ready once the debt is paid")
	}
	if ok, _ := b.Ready("b", t0); !ok {
		t.Fatal("another tenant charged")
	}
}

// The table keeps at most maxTracked buckets beyond those that are not
// full: refilled ones are dropped.
func TestBucketsDropRefilled(t *testing.T) {
	b := NewBuckets(1, 1)
	for i := range maxTracked {
		b.Take(string(rune(i)), 1, t0)
	}
	b.Take("new", 1, t0.Add(2*time.Second))
	if n := len(b.buckets); n != 1 {
		t.Fatalf("%d buckets after all refilled", n)
	}
}

// A tenant's bytes within the window count against its bound and free as
// they age out; a tenant with nothing counted may add one item larger
// than the bound; bytes given back free at once.
func TestTallyBoundsBytesWithinWindow(t *testing.T) {
	window := 64 * time.Hour // one slot an hour
	tl := NewTally(1000, window)
	if ok, _ := tl.Take("a", 600, t0); !ok {
		t.Fatal("first take refused")
	}
	if ok, _ := tl.Take("a", 300, t0.Add(10*time.Hour)); !ok {
		t.Fatal("take within the bound refused")
	}
	ok, wait := tl.Take("a", 200, t0.Add(20*time.Hour))
	if ok {
		t.Fatal("take past the bound admitted")
	}
	// The 600 of t0's slot leave when that slot leaves the window: at
	// most a slot more than the window after t0.
	if wait < window-20*time.Hour || wait > window-20*time.Hour+time.Hour {
		t.Fatalf("retry after %v", wait)
	}
	if ok, _ := tl.Take("b", 1000, t0); !ok {
		t.Fatal("another tenant refused")
	}
	if got := tl.Counted("a", t0.Add(20*time.Hour)); got != 900 {
		t.Fatalf("a counts %d, want 900", got)
	}
	if ok, _ := tl.Take("a", 200, t0.Add(20*time.Hour+wait)); !ok {
		t.Fatal("refused after the wait it was told")
	}
	if got := tl.Counted("a", t0.Add(20*time.Hour+wait)); got != 500 {
		t.Fatalf("after t0's bytes aged out a counts %d, want 500", got)
	}
	tl.Return("a", 200, t0.Add(20*time.Hour+wait))
	if got := tl.Counted("a", t0.Add(20*time.Hour+wait)); got != 300 {
		t.Fatalf("after a return a counts %d, want 300", got)
	}
	if got := tl.Counted("a", t0.Add(3*window)); got != 0 {
		t.Fatalf("after the window a counts %d", got)
	}
	if ok, _ := tl.Take("c", 5000, t0); !ok {
		t.Fatal("one item over the bound refused with nothing counted")
	}
	if ok, _ := tl.Take("c", 1, t0); ok {
		t.Fatal("a second item past the bound admitted")
	}
	var none *Tally = NewTally(0, window)
	if ok, _ := none.Take("a", 1<<40, t0); !ok || none.Max() != 0 {
		t.Fatal("no bound refused")
	}
}

// Without a window nothing ages out, and a refusal says no time.
func TestTallyWithoutWindow(t *testing.T) {
	tl := NewTally(10, 0)
	tl.Take("a", 10, t0)
	ok, wait := tl.Take("a", 1, t0.Add(1000*time.Hour))
	if ok || wait != 0 {
		t.Fatalf("ok %v wait %v", ok, wait)
	}
}

// What a tenant holds at once is bounded per tenant; one item larger than
// the bound passes when the tenant holds nothing; a release frees it.
func TestInFlightBoundsWhatATenantHolds(t *testing.T) {
	f := NewInFlight(10)
	if !f.Acquire("a", 6) || f.Acquire("a", 5) {
		t.Fatal("6 then 5 of 10")
	}
	if !f.Acquire("b", 10) {
		t.Fatal("another tenant refused")
	}
	f.Release("a", 6)
	if !f.Acquire("a", 50) || f.Acquire("a", 1) {
		t.Fatal("one item over the bound with nothing held")
	}
	f.Release("a", 50)
	if len(f.held) != 1 {
		t.Fatalf("%d tenants held after the releases, want 1", len(f.held))
	}
	var none *InFlight = NewInFlight(0)
	if !none.Acquire("a", 1<<40) || none.Max() != 0 {
		t.Fatal("no bound refused")
	}
}
