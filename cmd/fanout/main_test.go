package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/ops"
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

// The gateway takes the HTTP connection limits fabric run takes: a load
// driver's thousands of WebSockets from one address need the bound per
// address lifted.
func TestParseHTTPLimits(t *testing.T) {
	t.Setenv("FABRIC_JWT_SECRET", strings.Repeat("s", 32))
	o, _, err := parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.limits.MaxConnsPerAddr != ops.DefaultMaxConnsPerAddr || o.limits.IdleTimeout != ops.DefaultIdleTimeout {
		t.Fatalf("default limits %+v", o.limits)
	}
	o, _, err = parse([]string{"-max-conns-per-addr", "-1", "-max-conns", "5000", "-idle-timeout", "5s"})
	if err != nil {
		t.Fatal(err)
	}
	if o.limits != (ops.Limits{MaxConns: 5000, MaxConnsPerAddr: -1, IdleTimeout: 5 * time.Second}) {
		t.Fatalf("limits %+v", o.limits)
	}
	if _, _, err := parse([]string{"-max-conns-per-addr", "many"}); err == nil || !strings.Contains(err.Error(), "max-conns-per-addr") {
		t.Fatalf("a bad bound: %v", err)
	}
}
