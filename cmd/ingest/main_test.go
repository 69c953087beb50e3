package main

import (
	"strings"
	"testing"
)

// A bad setting stops the start with a message naming it, and every problem
// is reported at once.
func TestParseReportsEveryProblem(t *testing.T) {
	t.Setenv("FABRIC_JWT_SECRET", "short")
	_, _, err := parse([]string{"-nats-url", "http://x", "-rate", "0", "-max-batch", "-1", "-listen", "nope"})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"-nats-url", "-rate", "-max-batch", "-listen", "FABRIC_JWT_SECRET"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
}

func TestParseDefaults(t *testing.T) {
	t.Setenv("FABRIC_JWT_SECRET", strings.Repeat("s", 32))
	t.Setenv("FABRIC_MAX_BATCH", "50")
	o, secret, err := parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(secret) != 32 || o.maxBatch != 50 || !o.natsIntake {
		t.Fatalf("options = %+v", o)
	}
}
