package operations

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/quota"
	"github.com/fabric-mls/fabric/internal/refusal"
)

// Defaults of Quotas (docs/limits.md).
const (
	// DefaultRate is the operation requests per second one tenant may
	// make, records read included, with a burst of DefaultBurst.
	DefaultRate  = 50
	DefaultBurst = 100
	// DefaultByteRate is the stored operation bytes per second one tenant
	// may make, with a burst of the larger of it and two of the largest body
	// (a send at the bound and its retry).
	DefaultByteRate = 1 << 20
)

// Quotas bound what one tenant may make one API instance do (issue 27),
// over HTTP and NATS alike: past one the request is refused with 429 and
// Retry-After, before anything is stored.
type Quotas struct {
	// Rate is the requests per second per tenant, with a burst of Burst
	// (2×Rate when 0); DefaultRate when 0, none when negative.
	Rate  float64
	Burst int
	// ByteRate is the bytes of stored operations per second per tenant;
	// DefaultByteRate when 0, none when negative.
	ByteRate float64
	// InputBytes bounds the bytes each tenant has stored on FABRIC_IN
	// within its MaxAge, shared with the process's ingest; nil for none.
	InputBytes *quota.Tally
}

func (q Quotas) withDefaults() Quotas {
	if q.Rate == 0 {
		q.Rate = DefaultRate
	}
	if q.Burst <= 0 {
		q.Burst = int(2 * q.Rate)
	}
	if q.ByteRate == 0 {
		q.ByteRate = DefaultByteRate
	}
	return q
}

// limits are an API's quotas and the count of their refusals.
type limits struct {
	q        Quotas
	requests *quota.Buckets
	bytes    *quota.Buckets
	refused  *prometheus.CounterVec // code
}

func newLimits(q Quotas, reg prometheus.Registerer) *limits {
	q = q.withDefaults()
	l := &limits{
		q:        q,
		requests: quota.NewBuckets(q.Rate, q.Burst),
		bytes:    quota.NewBuckets(q.ByteRate, int(max(q.ByteRate, 2*maxBody))),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fabric_operations_quota_refusals_total",
			Help: "Operation requests refused past a tenant's quota, by code (rate_limited, byte_rate_limited, input_quota_exceeded).",
		}, []string{"code"}),
	}
	for _, e := range []*refusal.Error{quota.ErrRateLimited, quota.ErrByteRateLimited, quota.ErrInputQuota} {
		l.refused.WithLabelValues(e.Code)
	}
	if reg != nil {
		if err := reg.Register(l.refused); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				if c, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
					l.refused = c
				}
			}
		}
	}
	return l
}

// admit takes one request of tenant from its rate.
func (l *limits) admit(tenant string, now time.Time) error {
	if ok, wait := l.requests.Take(tenant, 1, now); !ok {
		return l.refuse(quota.ErrRateLimited.With("the tenant is over its rate of %g operation requests per second", l.q.Rate).After(wait))
	}
	return nil
}

// charge takes n stored bytes of tenant from its byte rate and counts them
// on FABRIC_IN; release gives the count back when nothing was stored.
func (l *limits) charge(tenant string, n int, now time.Time) (release func(), err error) {
	if ok, wait := l.bytes.Take(tenant, n, now); !ok {
		return nil, l.refuse(quota.ErrByteRateLimited.With("the tenant is over its rate of %g operation bytes per second", l.q.ByteRate).After(wait))
	}
	if ok, wait := l.q.InputBytes.Take(tenant, int64(n), now); !ok {
		return nil, l.refuse(quota.ErrInputQuota.With("the tenant's input stored on FABRIC_IN within its retention is at its bound of %d bytes", l.q.InputBytes.Max()).After(wait))
	}
	return func() { l.q.InputBytes.Return(tenant, int64(n), now) }, nil
}

func (l *limits) refuse(e *refusal.Error) error {
	l.refused.WithLabelValues(e.Code).Inc()
	return e
}
