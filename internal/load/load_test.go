package load

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/fanout"
)

// A large workload's set-up keeps going as long as hosted clients keep
// joining, past any one fixed bound, and gives up once none joins.
func TestSetupWaitsWhileJoinsProgress(t *testing.T) {
	var n atomic.Int64
	count := func() int64 { return n.Add(1) } // one more join at each look
	start := time.Now()
	if err := awaitProgress(context.Background(), 100*time.Millisecond, count, 20); err != nil {
		t.Fatalf("joins kept coming but the wait failed after %s: %v", time.Since(start), err)
	}
	if err := awaitProgress(context.Background(), 100*time.Millisecond, func() int64 { return 3 }, 20); !errors.Is(err, errStalled) {
		t.Fatalf("no join for longer than the stall: %v, want errStalled", err)
	}
}

// The run sends the rate over the duration whatever the number of groups:
// with more groups than messages, the extra groups stay idle rather than
// each sending one and stretching the run past its duration.
func TestMessagesSpreadOverGroupsAddUpToRateTimesDuration(t *testing.T) {
	for _, c := range []struct{ total, groups int }{{400, 100}, {400, 1000}, {400, 10000}, {1500, 7}} {
		sum, busy := 0, 0
		for i := range c.groups {
			n := perGroup(c.total, c.groups, i)
			sum += n
			if n > 0 {
				busy++
			}
		}
		if sum != c.total {
			t.Errorf("%d messages over %d groups: the groups send %d", c.total, c.groups, sum)
		}
		if want := min(c.total, c.groups); busy != want {
			t.Errorf("%d messages over %d groups: %d groups send, want %d", c.total, c.groups, busy, want)
		}
	}
}

// By default each hosted client has its own WebSocket, and the gateway
// refuses a tenant's connections past its quota: a workload over it is
// refused before anything starts, not at its first refused connection
// minutes in. Sharing connections counts WebSockets, not hosted clients,
// and a connection takes at most the gateway's subscriptions per connection.
func TestWorkloadOverTheTenantConnectionQuotaIsRefused(t *testing.T) {
	w := Workload{Tenants: 10, Groups: 100, Members: 10, Rate: 20, Duration: time.Second}
	if err := w.Validate(); err != nil {
		t.Fatalf("1,000 hosted clients per tenant, at the quota: %v", err)
	}
	w.Groups = 101
	if err := w.Validate(); err == nil {
		t.Fatal("1,010 hosted clients per tenant, over the gateway's quota of 1,000 connections: no error")
	}
	w.ClientsPerConn = 2
	if err := w.Validate(); err != nil {
		t.Fatalf("1,010 hosted clients per tenant on 505 connections: %v", err)
	}
	w.Groups, w.ClientsPerConn = 10_000, 10
	if err := w.Validate(); err == nil {
		t.Fatal("100,000 hosted clients per tenant on 10,000 connections, over the quota: no error")
	}
	w.ClientsPerConn = 100
	if err := w.Validate(); err != nil {
		t.Fatalf("100,000 hosted clients per tenant on 1,000 connections: %v", err)
	}
	w.ClientsPerConn = fanout.DefaultMaxSubscriptions + 1
	w.Groups = 1
	if err := w.Validate(); err == nil {
		t.Fatalf("%d hosted clients per connection, over the gateway's subscriptions per connection: no error", w.ClientsPerConn)
	}
}
