package ingest

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxTrackedTenants bounds the limiter table: past it, buckets idle for
// longer than a refill are dropped (a dropped bucket restarts full, which
// is what an idle bucket is anyway).
const maxTrackedTenants = 10000

// tenantLimiter is one token bucket per tenant, counted in transport
// messages.
type tenantLimiter struct {
	limit rate.Limit
	burst int

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	lim  *rate.Limiter
	last time.Time
}

func newTenantLimiter(perSecond float64, burst int) *tenantLimiter {
	if perSecond < 0 {
		return nil
	}
	return &tenantLimiter{limit: rate.Limit(perSecond), burst: burst, buckets: map[string]*bucket{}}
}

// allow takes n tokens from tenant's bucket. When it cannot, it takes none
// and says how long until it could.
func (t *tenantLimiter) allow(tenant string, n int, now time.Time) (ok bool, retryAfter time.Duration) {
	if t == nil {
		return true, 0
	}
	if n > t.burst {
		// Never satisfiable; the batch limit normally prevents this.
		return false, time.Second
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	b, found := t.buckets[tenant]
	if !found {
		if len(t.buckets) >= maxTrackedTenants {
			t.evictIdle(now)
		}
		b = &bucket{lim: rate.NewLimiter(t.limit, t.burst)}
		t.buckets[tenant] = b
	}
	b.last = now
	r := b.lim.ReserveN(now, n)
	if !r.OK() {
		return false, time.Second
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

func (t *tenantLimiter) evictIdle(now time.Time) {
	full := time.Duration(float64(t.burst) / float64(t.limit) * float64(time.Second))
	for k, b := range t.buckets {
		if now.Sub(b.last) > full {
			delete(t.buckets, k)
		}
	}
}
