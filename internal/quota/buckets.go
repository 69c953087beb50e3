// Package quota holds the per-tenant bounds every front of the fabric
// applies (docs/limits.md): token buckets of a rate with a burst (Buckets)
// and a tally of the bytes a tenant added to a store within its retention
// (Tally), with the refusals they lead to. A quota is kept by the process
// that applies it; N processes admit up to N times a quota.
package quota

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxTracked bounds a bucket table: past it, buckets that have refilled
// are dropped (a dropped bucket restarts full, which is what a refilled
// one is).
const maxTracked = 10000

// Buckets is one token bucket per key (a tenant), each refilled at a rate
// up to its burst. A nil *Buckets is no limit: every method allows.
type Buckets struct {
	limit rate.Limit
	burst int

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

// NewBuckets returns buckets of perSecond tokens a second holding at most
// burst (at least 1); nil, no limit, when perSecond is not positive.
func NewBuckets(perSecond float64, burst int) *Buckets {
	if perSecond <= 0 {
		return nil
	}
	return &Buckets{limit: rate.Limit(perSecond), burst: max(burst, 1), buckets: map[string]*rate.Limiter{}}
}

// Burst is a bucket's size; 0 for no limit.
func (b *Buckets) Burst() int {
	if b == nil {
		return 0
	}
	return b.burst
}

// Take takes n tokens from key's bucket. When it cannot, it takes none and
// says how long until it could; n over the burst never can (a second is
// said then).
func (b *Buckets) Take(key string, n int, now time.Time) (ok bool, retryAfter time.Duration) {
	if b == nil || n <= 0 {
		return true, 0
	}
	if n > b.burst {
		return false, time.Second
	}
	r := b.bucket(key, now).ReserveN(now, n)
	if !r.OK() {
		return false, time.Second
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// Ready reports whether key's bucket holds a token, for a cost known only
// afterwards (Charge); when not, how long until it does.
func (b *Buckets) Ready(key string, now time.Time) (ok bool, retryAfter time.Duration) {
	if b == nil {
		return true, 0
	}
	tokens := b.bucket(key, now).TokensAt(now)
	if tokens >= 1 {
		return true, 0
	}
	return false, time.Duration((1 - tokens) / float64(b.limit) * float64(time.Second))
}

// Charge takes n tokens from key's bucket, into debt if it holds fewer (at
// most a burst's worth: what one cost can owe), which later calls wait out
// through Ready.
func (b *Buckets) Charge(key string, n int, now time.Time) {
	if b == nil || n <= 0 {
		return
	}
	b.bucket(key, now).ReserveN(now, min(n, b.burst))
}

func (b *Buckets) bucket(key string, now time.Time) *rate.Limiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.buckets[key]
	if l == nil {
		if len(b.buckets) >= maxTracked {
			for k, old := range b.buckets {
				if old.TokensAt(now) >= float64(b.burst) {
					delete(b.buckets, k)
				}
			}
		}
		l = rate.NewLimiter(b.limit, b.burst)
		b.buckets[key] = l
	}
	return l
}
