package eventually

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that records a Fatalf instead of ending the test.
type recorder struct {
	testing.TB
	failed atomic.Bool
	msg    string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
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

func TestNoErrorReturnsOnceTheCheckPasses(t *testing.T) {
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

func TestNoErrorWithinFailsWithTheLastError(t *testing.T) {
	r := &recorder{TB: t}
	var n atomic.Int32
	run(r, func() {
		NoErrorWithin(r, 50*time.Millisecond, func() error { return fmt.Errorf("poll %d", n.Add(1)) })
	})
	if !r.failed.Load() {
		t.Fatal("a check that never passes did not fail the test")
	}
	if want := fmt.Sprintf("poll %d", n.Load()); !strings.HasSuffix(r.msg, want) {
		t.Fatalf("failed with %q, want the last error %q", r.msg, want)
	}
}
