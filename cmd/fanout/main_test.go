package main

import (
	"strings"
	"testing"
)

func TestParseDefaults(t *testing.T) {
	t.Setenv("FABRIC_JWT_SECRET", strings.Repeat("s", 32))
	o, k, err := parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.listen != ":8083" || o.maxSubs <= 0 || len(k.secret) != 32 || k.verifier == nil {
		t.Fatalf("defaults: %+v", o)
	}
}

func TestParseRefusesBadValues(t *testing.T) {
	t.Setenv("FABRIC_JWT_SECRET", "short")
	_, _, err := parse([]string{"-max-subscriptions", "0", "-listen", "nope", "-write-timeout", "0s"})
	if err == nil {
		t.Fatal("bad configuration accepted")
	}
	for _, want := range []string{"-max-subscriptions", "-listen", "-write-timeout", "FABRIC_JWT_SECRET"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
}
