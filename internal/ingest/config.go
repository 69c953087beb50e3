package ingest

import (
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/quota"
)

// Defaults for the zero values of Limits and Config.
const (
	DefaultMaxBodyBytes         = 8 << 20
	DefaultMaxBatch             = 1000
	DefaultMaxMessageBytes      = 1 << 20
	DefaultRatePerTenant        = 20000
	DefaultMaxRetainedPerTenant = 10000
	DefaultMaxBytesInFlight     = 64 << 20
	DefaultByteRatePerTenant    = 32 << 20
	DefaultQueueGroup           = "ingest"
	DefaultNATSWorkers          = 8
	DefaultProcessTimeout       = 30 * time.Second
	DefaultDrainTimeout         = 30 * time.Second
)

// Limits bound what one caller can make a worker do. A zero field takes its
// default.
type Limits struct {
	// MaxBodyBytes bounds one request body (HTTP) or request payload (NATS).
	MaxBodyBytes int64
	// MaxBatch bounds the number of transport messages in one request.
	MaxBatch int
	// MaxMessageBytes bounds one transport message's payload.
	MaxMessageBytes int
	// RatePerTenant is the sustained number of transport messages a tenant
	// may submit per second; a negative value disables the limit.
	RatePerTenant float64
	// BurstPerTenant is the token bucket's size; it defaults to the larger
	// of MaxBatch and RatePerTenant.
	BurstPerTenant int
	// MaxRetainedPerTenant bounds the objects a tenant may have retained on
	// FABRIC_RETAINED (transport-deferred and unknown-group input together).
	// Beyond it input is refused with resource_refused.
	MaxRetainedPerTenant int
	// MaxBytesInFlight bounds the HTTP request bodies one worker holds at
	// once; past it a request is refused with 503 overloaded. A single
	// request is always admitted.
	MaxBytesInFlight int64
	// ByteRatePerTenant is the sustained payload bytes per second a tenant
	// may submit, with a burst of the larger of MaxBodyBytes and the rate;
	// past it 429 byte_rate_limited. Negative disables it.
	ByteRatePerTenant float64
}

func (l Limits) withDefaults() Limits {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.MaxBatch <= 0 {
		l.MaxBatch = DefaultMaxBatch
	}
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if l.RatePerTenant == 0 {
		l.RatePerTenant = DefaultRatePerTenant
	}
	if l.BurstPerTenant <= 0 {
		l.BurstPerTenant = max(l.MaxBatch, int(l.RatePerTenant))
	}
	if l.MaxBytesInFlight <= 0 {
		l.MaxBytesInFlight = DefaultMaxBytesInFlight
	}
	if l.ByteRatePerTenant == 0 {
		l.ByteRatePerTenant = DefaultByteRatePerTenant
	}
	if l.MaxRetainedPerTenant <= 0 {
		l.MaxRetainedPerTenant = DefaultMaxRetainedPerTenant
	}
	return l
}

// Config configures a Service.
type Config struct {
	// Conn is the NATS connection the service uses. Required; the service
	// does not close it.
	Conn *nats.Conn
	// Domain is the JetStream domain of the servers; empty for the local
	// one.
	Domain string
	// Verifier checks bearer tokens on HTTP, and on NATS intake when
	// NATSRequireToken is set. Required.
	Verifier *auth.Verifier
	// Vault opens the group event keys converge seals into
	// fabric-group-keys. Required.
	Vault *engine.Vault
	// Limits bound requests; zero fields take defaults.
	Limits Limits
	// InputBytes bounds the payload bytes each tenant has stored on
	// FABRIC_IN within its MaxAge, counted by this process (shared with
	// the operations API of the same process, docs/limits.md); nil for no
	// bound.
	InputBytes *quota.Tally
	// NATSIntake enables the request subject fabric.intake.<tenant>.
	NATSIntake bool
	// NATSRequireToken makes NATS intake require an "Authorization: Bearer"
	// header as HTTP does. Without it, NATS account permissions alone decide
	// who may publish to a tenant's intake subject (docs/ingest.md).
	NATSRequireToken bool
	// QueueGroup is the NATS queue group of the intake subscription;
	// DefaultQueueGroup when empty.
	QueueGroup string
	// NATSWorkers is how many NATS intake requests one worker processes at
	// once; DefaultNATSWorkers when zero.
	NATSWorkers int
	// ProcessTimeout bounds the processing of one request once started; it
	// runs to completion even if the caller goes away, so an input is never
	// left half-admitted by a disconnect.
	ProcessTimeout time.Duration
	// DrainTimeout bounds Run's drain once its context ends;
	// DefaultDrainTimeout when zero.
	DrainTimeout time.Duration
	// Logger receives diagnostics; slog.Default() when nil.
	Logger *slog.Logger
	// Registerer receives the metrics; none are registered when nil.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() (Config, error) {
	if c.Conn == nil {
		return c, errors.New("ingest: Config.Conn is required")
	}
	if c.Verifier == nil {
		return c, errors.New("ingest: Config.Verifier is required")
	}
	if c.Vault == nil {
		return c, errors.New("ingest: Config.Vault is required")
	}
	c.Limits = c.Limits.withDefaults()
	if c.QueueGroup == "" {
		c.QueueGroup = DefaultQueueGroup
	}
	if c.NATSWorkers <= 0 {
		c.NATSWorkers = DefaultNATSWorkers
	}
	if c.ProcessTimeout <= 0 {
		c.ProcessTimeout = DefaultProcessTimeout
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}
