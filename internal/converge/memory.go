package converge

import (
	"context"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// memoryRelease returns to the system the memory that dropping idle groups
// freed (Config.IdleAfter), at most once per period. The runtime's
// background scavenger alone left an idle worker about three times the
// RSS per dropped member (issue 21; docs/converge.md, Memory per idle
// hosted member).
type memoryRelease struct {
	period time.Duration
	due    chan struct{} // a release run performs next

	mu      sync.Mutex
	pending bool      // groups were dropped since the last release
	last    time.Time // the last release, on the worker's clock
	asked   int       // the releases handed to run so far
}

func newMemoryRelease(period time.Duration) *memoryRelease {
	return &memoryRelease{period: period, due: make(chan struct{}, 1)}
}

// poll notes whether idle groups were just dropped and asks run for a
// release when some were dropped since the last one and the period since
// it has passed. Every partition polls after each fetch, so a release held
// back by the period follows within a cleanup interval of its end.
func (r *memoryRelease) poll(now time.Time, dropped bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = r.pending || dropped
	if !r.pending || !r.last.IsZero() && now.Sub(r.last) < r.period {
		return
	}
	r.pending, r.last = false, now
	select {
	case r.due <- struct{}{}:
		r.asked++
	default: // one asked already and not begun: it covers this drop
	}
}

// run performs the releases poll asks for until ctx ends, off the
// partitions' goroutines: a release collects the whole heap first.
func (r *memoryRelease) run(ctx context.Context, released prometheus.Counter, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.due:
		}
		start := time.Now()
		debug.FreeOSMemory()
		released.Inc()
		log.Debug("converge: returned the memory of idle groups to the system", "took", time.Since(start))
	}
}
