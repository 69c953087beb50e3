package read

import (
	"net/http"
	"time"

	"github.com/fabric-mls/fabric/internal/quota"
	"github.com/fabric-mls/fabric/internal/refusal"
)

// Defaults of Quotas (docs/limits.md, docs/read-api.md).
const (
	// DefaultRate is the read requests per second one tenant may make,
	// with a burst of DefaultBurst.
	DefaultRate  = 100
	DefaultBurst = 200
	// DefaultByteRate is the answer bytes per second one tenant may read,
	// with a burst of the larger of it and a page's bound.
	DefaultByteRate = 4 << 20
	// DefaultPageBytes bounds the messages of one page.
	DefaultPageBytes = 4 << 20
	// DefaultInFlightBytes bounds the records one tenant's requests hold
	// at once: a page's worth.
	DefaultInFlightBytes = DefaultPageBytes
)

// Quotas bound what one tenant may make one API instance read (issue 27):
// past one the request is refused with 429 and Retry-After before
// anything is read.
type Quotas struct {
	// Rate is the requests per second per tenant, with a burst of Burst
	// (2×Rate when 0); DefaultRate when 0, none when negative.
	Rate  float64
	Burst int
	// ByteRate is the answer bytes per second per tenant, charged once
	// an answer is written: a tenant in debt is refused until it has paid
	// it off. DefaultByteRate when 0, none when negative.
	ByteRate float64
	// PageBytes bounds the messages of one page of GET …/messages, as
	// JSON: the page ends before the message that would pass it, with a
	// cursor; a single message larger is a page of its own.
	// DefaultPageBytes when 0.
	PageBytes int
	// InFlightBytes bounds the stored records one tenant's requests have
	// read and not yet answered, all at once: a page that would pass it
	// ends early with its cursor, one that has nothing yet is refused.
	// DefaultInFlightBytes when 0, none when negative.
	InFlightBytes int64
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
	if q.PageBytes <= 0 {
		q.PageBytes = DefaultPageBytes
	}
	if q.InFlightBytes == 0 {
		q.InFlightBytes = DefaultInFlightBytes
	}
	return q
}

// limits are an API's quotas.
type limits struct {
	q        Quotas
	requests *quota.Buckets
	bytes    *quota.Buckets
	inFlight *quota.InFlight
	m        *metrics
}

func newLimits(q Quotas, m *metrics) *limits {
	q = q.withDefaults()
	return &limits{q: q, m: m, requests: quota.NewBuckets(q.Rate, q.Burst),
		bytes:    quota.NewBuckets(q.ByteRate, int(max(q.ByteRate, float64(q.PageBytes)))),
		inFlight: quota.NewInFlight(q.InFlightBytes)}
}

// admit takes one request of tenant from its rate, if it is not in debt
// of answer bytes.
func (l *limits) admit(tenant string, now time.Time) error {
	if ok, wait := l.bytes.Ready(tenant, now); !ok {
		return l.refuse(quota.ErrByteRateLimited.With("the tenant is over its rate of %g answer bytes per second", l.q.ByteRate).After(wait))
	}
	if ok, wait := l.requests.Take(tenant, 1, now); !ok {
		return l.refuse(quota.ErrRateLimited.With("the tenant is over its rate of %g read requests per second", l.q.Rate).After(wait))
	}
	return nil
}

const codeReadsInFlight = "reads_in_flight"

// ErrReadsInFlight refuses a read while the tenant's other reads hold
// its bound of records in flight.
var ErrReadsInFlight = refusal.New(refusal.RateLimited, codeReadsInFlight, "the tenant's reads in flight hold its bound of bytes; retry")

// hold counts n bytes of records read for tenant in flight, until
// release; false when they would pass the tenant's bound.
func (l *limits) hold(tenant string, n int) bool { return l.inFlight.Acquire(tenant, int64(n)) }

func (l *limits) release(tenant string, n int) { l.inFlight.Release(tenant, int64(n)) }

// charge takes an answer's bytes from tenant's byte rate.
func (l *limits) charge(tenant string, n int, now time.Time) { l.bytes.Charge(tenant, n, now) }

func (l *limits) refuse(e *refusal.Error) error {
	l.m.quotaRefusals.WithLabelValues(e.Code).Inc()
	return e
}

// countingWriter counts the body bytes written.
type countingWriter struct {
	http.ResponseWriter
	n int
}

func (w *countingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.n += n
	return n, err
}
