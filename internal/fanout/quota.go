package fanout

import (
	"time"

	"github.com/fabric-mls/fabric/internal/quota"
)

// Defaults of the per-tenant quotas.
const (
	// DefaultMaxConnsPerTenant bounds one tenant's open event connections
	// on one gateway, WebSocket and SSE together.
	DefaultMaxConnsPerTenant = 1000
	// DefaultMaxReplay bounds the stored events handed off to resume one
	// subscription; a resume further back than that hands off one lagged
	// counting the rest its filter selects (EVENT-031).
	DefaultMaxReplay = 10000
	// DefaultReplayRate is the stored events per second one tenant may
	// have read to resume subscriptions on one gateway, with a burst of
	// DefaultReplayBurst.
	DefaultReplayRate  = 10000
	DefaultReplayBurst = 20000
)

// Error codes of quota refusals.
const (
	// CodeTooManyConnections refuses a connection past the tenant's quota
	// (ErrTooManyConnections).
	CodeTooManyConnections = "too_many_connections"
	// CodeReplayBudget refuses a resuming subscribe while the tenant's
	// replay budget is spent; a subscribe without after_seq is not refused.
	CodeReplayBudget = "replay_budget_exceeded"
)

// quotas are the per-tenant bounds of one gateway: open connections and
// the rate of replayed events.
type quotas struct {
	maxConns int
	conns    *quota.InFlight
	replay   *quota.Buckets
}

func newQuotas(c *Config) *quotas {
	return &quotas{maxConns: c.MaxConnsPerTenant, conns: quota.NewInFlight(int64(c.MaxConnsPerTenant)),
		replay: quota.NewBuckets(float64(c.ReplayRate), c.ReplayBurst)}
}

// admitConn counts a connection of tenant in, or refuses it. The caller
// calls releaseConn when the connection ends.
func (q *quotas) admitConn(tenant string) error {
	if !q.conns.Acquire(tenant, 1) {
		return ErrTooManyConnections.With("the tenant has %d open event connections on this gateway, its quota", q.maxConns)
	}
	return nil
}

func (q *quotas) releaseConn(tenant string) { q.conns.Release(tenant, 1) }

// replayAllowed reports whether tenant has replay budget left.
func (q *quotas) replayAllowed(tenant string, now time.Time) bool {
	ok, _ := q.replay.Ready(tenant, now)
	return ok
}

// chargeReplay takes n replayed events from tenant's budget; it may go
// into debt, which later replays wait out.
func (q *quotas) chargeReplay(tenant string, n int, now time.Time) {
	q.replay.Charge(tenant, n, now)
}
