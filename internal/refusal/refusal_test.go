package refusal

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

var errTest = New(RateLimited, "rate_limited", "over the rate")

// A refusal with its own message and retry time, wrapped with context,
// still matches its sentinel, and only it.
func TestRefusalMatchesItsSentinel(t *testing.T) {
	err := fmt.Errorf("submit: %w", errTest.With("over %d per second", 5).After(time.Second))
	if !errors.Is(err, errTest) {
		t.Fatalf("%v does not match its sentinel", err)
	}
	if errors.Is(err, New(RateLimited, "byte_rate_limited", "")) || errors.Is(err, New(Unavailable, "rate_limited", "")) {
		t.Fatal("matches another code or kind")
	}
	var e *Error
	if !errors.As(err, &e) || e.Message != "over 5 per second" || e.RetryAfter != time.Second || errTest.Message != "over the rate" {
		t.Fatalf("got %+v, sentinel %+v", e, errTest)
	}
	if Code(err) != "rate_limited" || Code(errors.New("x")) != CodeInternal {
		t.Fatal("Code")
	}
}

// A refusal because of a validation error still names it to errors.As.
func TestRefusalKeepsItsCause(t *testing.T) {
	cause := errors.New("kind: unknown")
	err := New(Unprocessable, "invalid_event", "").Because(cause)
	if !errors.Is(err, cause) || err.Message != "kind: unknown" {
		t.Fatalf("%v", err)
	}
}

func TestKindsNamed(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range Kinds {
		if s := k.String(); seen[s] || s == "" {
			t.Fatalf("kind %d named %q twice or not at all", k, s)
		}
		seen[k.String()] = true
	}
}
