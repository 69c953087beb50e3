// Package eventually is the tests' one way to wait for a condition that
// becomes true: it polls, so a test states what it waits for rather than
// sleeping for a guessed time.
package eventually

import (
	"testing"
	"time"
)

// Timeout is how long True and NoError wait. It is generous because the
// suite runs under -race on two shared cores: it bounds a hang, it does not
// measure speed.
const Timeout = 20 * time.Second

// every is the polling interval.
const every = 20 * time.Millisecond

// True polls cond until it holds, and fails t naming what when Timeout
// passes first.
func True(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Within(t, Timeout, what, cond)
}

// Within is True with its own timeout, for conditions that wait on a
// process start, a cluster election or a deliberately slow path.
func Within(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", d, what)
		}
		time.Sleep(every)
	}
}

// NoError polls check until it returns nil, and fails t with the last
// error when Timeout passes first: the error says what the state was.
func NoError(t testing.TB, check func() error) {
	t.Helper()
	NoErrorWithin(t, Timeout, check)
}

// NoErrorWithin is NoError with its own timeout.
func NoErrorWithin(t testing.TB, d time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %v", d, err)
		}
		time.Sleep(every)
	}
}
