package eventually

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that records a Fatalf instead of ending the test.
type recorder struct {
	testing.TB
	failed atomic.Bool
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(string, ...any) {
	r.failed.Store(true)
	// Fatalf must not return into the polling loop.
	panic(r)
}

func run(r *recorder, f func()) {
	defer func() {
		if p := recover(); p != nil && p != any(r) {
			panic(p)
		}
	}()
	f()
}

func TestTrueReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	True(t, "the third poll", func() bool { return n.Add(1) == 3 })
	if n.Load() != 3 {
		t.Fatalf("polled %d times, want 3", n.Load())
	}
}

func TestWithinFailsWhenTheConditionNeverHolds(t *testing.T) {
	r := &recorder{TB: t}
	run(r, func() { Within(r, 50*time.Millisecond, "never", func() bool { return false }) })
	if !r.failed.Load() {
		t.Fatal("a condition that never holds did not fail the test")
	}
}

func TestNoErrorReportsTheLastError(t *testing.T) {
	var n atomic.Int32
	NoError(t, func() error {
		if n.Add(1) < 2 {
			return errors.New("not yet")
		}
		return nil
	})
	if n.Load() != 2 {
		t.Fatalf("polled %d times, want 2", n.Load())
	}
}
