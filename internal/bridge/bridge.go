// Package bridge forwards one fabric's outbound transport messages to
// another fabric's transport endpoint, so two deployments hold one
// conversation (issue 19, docs/outbound.md "Bridge").
//
// It reads one tenant's outbound subjects (fabric.out.<tenant>.*) through a
// durable pull consumer on FABRIC_EVENTS, which the source's ingest makes
// when the bridge asks (provision.go), and posts them, in order, in batches,
// to POST /v1/tenants/{tenant}/transport of the destination. A message is
// acknowledged only after the destination answered it: at least once here,
// and the destination's dedup (an input's message id is SHA-256 of its MLS
// bytes, the source's Fabric-Message-Id) makes it exactly once there.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Defaults for the zero fields of Config.
const (
	DefaultDurable    = "fabric-bridge"
	DefaultMaxBatch   = 256
	DefaultMaxBytes   = 4 << 20
	DefaultAckWait    = 30 * time.Second
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second
	// DefaultRequestTimeout bounds one post to the destination.
	DefaultRequestTimeout = 30 * time.Second
)

// Config configures a Bridge.
type Config struct {
	// JS reaches the source fabric's JetStream. Required.
	JS jetstream.JetStream
	// Tenant is the source tenant whose outbound subjects are forwarded.
	// Required.
	Tenant string
	// Durable names the consumer on FABRIC_EVENTS; DefaultDurable when
	// empty. Two bridges of one tenant to two destinations need two names.
	Durable string
	// Destination is the base URL of the destination fabric's HTTP API,
	// like https://fabric-b.example:8080. Required.
	Destination string
	// DestinationTenant is the tenant at the destination; Tenant when empty.
	DestinationTenant string
	// Token returns the bearer token for the destination (scope ingest for
	// DestinationTenant). Required.
	Token func(context.Context) (string, error)
	// HTTPClient posts to the destination; a client with
	// DefaultRequestTimeout when nil.
	HTTPClient *http.Client
	// MaxBatch and MaxBytes bound one post: messages and their bytes.
	// Keep them within the destination's -max-batch and -max-body.
	MaxBatch int
	MaxBytes int
	// AckWait is the consumer's acknowledgement wait; a bridge that dies
	// holding messages gets them again after it.
	AckWait time.Duration
	// MinBackoff and MaxBackoff bound the wait between retries of a post
	// the destination could not take (network errors, 5xx).
	MinBackoff, MaxBackoff time.Duration
	// Registerer receives the fabric_bridge_ metrics; none when nil.
	Registerer prometheus.Registerer
	// Logger receives diagnostics; slog.Default when nil.
	Logger *slog.Logger
}

// Bridge forwards outbound messages; New, then Run.
type Bridge struct {
	cfg     Config
	filter  string
	request string // subject.BridgeRequest of the tenant and durable
	url     string
	log     *slog.Logger
	metrics *metrics
	started chan struct{}
}

// New checks cfg and builds a Bridge; it connects nothing.
func New(cfg Config) (*Bridge, error) {
	if cfg.JS == nil || cfg.Token == nil {
		return nil, errors.New("bridge: JS and Token are required")
	}
	filter, err := subject.OutboundTenant(cfg.Tenant)
	if err != nil {
		return nil, fmt.Errorf("bridge: source tenant: %w", err)
	}
	if cfg.DestinationTenant == "" {
		cfg.DestinationTenant = cfg.Tenant
	}
	if err := subject.ValidTenant(cfg.DestinationTenant); err != nil {
		return nil, fmt.Errorf("bridge: destination tenant: %w", err)
	}
	if !strings.HasPrefix(cfg.Destination, "http://") && !strings.HasPrefix(cfg.Destination, "https://") {
		return nil, fmt.Errorf("bridge: destination %q is not an http:// or https:// URL", cfg.Destination)
	}
	if cfg.Durable == "" {
		cfg.Durable = DefaultDurable
	}
	request, err := subject.BridgeRequest(cfg.Tenant, cfg.Durable)
	if err != nil {
		return nil, fmt.Errorf("bridge: durable name: %w", err)
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: DefaultRequestTimeout}
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = DefaultAckWait
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.MinBackoff)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Bridge{
		cfg:     cfg,
		filter:  filter,
		request: request,
		url:     strings.TrimSuffix(cfg.Destination, "/") + "/v1/tenants/" + cfg.DestinationTenant + "/transport",
		log:     cfg.Logger.With("tenant", cfg.Tenant, "durable", cfg.Durable),
		metrics: m,
		started: make(chan struct{}),
	}, nil
}

// Started is closed once the consumer exists: what the source stores after
// it is forwarded, and what it stored before, from the consumer's position.
func (b *Bridge) Started() <-chan struct{} { return b.started }

// Ready reports whether the bridge has its consumer.
func (b *Bridge) Ready(context.Context) error {
	select {
	case <-b.started:
		return nil
	default:
		return errors.New("bridge: no consumer yet")
	}
}

// Run makes the consumer (retried until it exists) and forwards until ctx
// ends (nil) or the destination refuses the bridge itself: a 401, 403 or
// 404 (the token, its tenant or the URL is wrong) returns a *RefusedError,
// nothing of the batch acknowledged.
func (b *Bridge) Run(ctx context.Context) error {
	c, err := b.consumer(ctx)
	if err != nil {
		return nil // ctx ended
	}
	close(b.started)
	b.log.Info("bridge started", "destination", b.url)
	for ctx.Err() == nil {
		if err := b.fetch(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// fetch forwards one fetch of messages. The fetch waits at most a second
// and ends when ctx does, so a bridge stops without waiting out an idle
// pull; what it received but did not forward is delivered again.
func (b *Bridge) fetch(ctx context.Context, c jetstream.Consumer) error {
	fctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	batch, err := c.Fetch(b.cfg.MaxBatch, jetstream.FetchContext(fctx))
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, jetstream.ErrNoMessages) {
			b.log.Warn("bridge: fetch", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		return nil
	}
	return b.drain(ctx, batch)
}

// consumer asks the source for the bridge's durable consumer and binds it
// (provision.go), retrying with backoff until ctx ends: a source that
// answers late (a loaded meta leader), not yet (no provisioner, no stream)
// or refuses (a name another tenant's bridge holds, a request the user may
// not send) is waited for, not fatal, and logged at each attempt.
func (b *Bridge) consumer(ctx context.Context) (jetstream.Consumer, error) {
	backoff := b.cfg.MinBackoff
	for {
		c, err := b.askConsumer(ctx)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		b.log.Warn("bridge: no consumer yet; retrying", "stream", streams.StreamEvents, "filter", b.filter, "in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, b.cfg.MaxBackoff)
	}
}

// drain forwards a fetch's messages as they arrive: what has arrived is
// posted as soon as nothing more is waiting, so a message waits for no
// batch to fill.
func (b *Bridge) drain(ctx context.Context, batch jetstream.MessageBatch) error {
	msgs := batch.Messages()
	var held []jetstream.Msg
	for {
		var (
			msg jetstream.Msg
			ok  bool
		)
		if len(held) == 0 {
			msg, ok = <-msgs
		} else {
			select {
			case msg, ok = <-msgs:
			default:
				if err := b.forward(ctx, held); err != nil {
					return err
				}
				held = held[:0]
				continue
			}
		}
		if !ok {
			break
		}
		held = append(held, msg)
	}
	if err := batch.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
		b.log.Warn("bridge: fetch", "err", err)
	}
	return b.forward(ctx, held)
}

// forward posts held in order, in chunks within MaxBatch and MaxBytes,
// acknowledging each chunk once the destination answered it. When ctx
// ends, what is not acknowledged is released at once for the next run.
func (b *Bridge) forward(ctx context.Context, held []jetstream.Msg) error {
	for len(held) > 0 {
		n, size := 0, 0
		for n < len(held) && n < b.cfg.MaxBatch && (n == 0 || size+len(held[n].Data()) <= b.cfg.MaxBytes) {
			size += len(held[n].Data())
			n++
		}
		if err := b.deliver(ctx, held[:n]); err != nil {
			for _, m := range held {
				_ = m.Nak()
			}
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		held = held[n:]
	}
	return nil
}

// deliver posts chunk until the destination answers it, then acknowledges
// it. A chunk the destination refuses as a request (400, 413) is posted
// again one message at a time, so only the message it refuses is dropped
// (terminated, counted, logged).
func (b *Bridge) deliver(ctx context.Context, chunk []jetstream.Msg) error {
	var refused *RefusedError
	err := b.post(ctx, chunk)
	switch {
	case err == nil:
		for _, m := range chunk {
			_ = m.Ack()
		}
		b.recordPending(chunk[len(chunk)-1])
		return nil
	case !errors.As(err, &refused) || refused.Fatal():
		return err
	case len(chunk) > 1:
		for i := range chunk {
			if err := b.deliver(ctx, chunk[i:i+1]); err != nil {
				return err
			}
		}
		return nil
	default:
		md, _ := chunk[0].Metadata()
		b.log.Error("bridge: the destination refuses a message; it is dropped", "subject", chunk[0].Subject(),
			"message_id", chunk[0].Headers().Get(bus.HeaderMessageID), "stream_seq", seq(md), "status", refused.Status, "code", refused.Code, "err", refused.Message)
		b.metrics.refusedWith(refused.Code)
		_ = chunk[0].Term()
		return nil
	}
}

func (b *Bridge) recordPending(m jetstream.Msg) {
	if md, err := m.Metadata(); err == nil {
		b.metrics.pending.Set(float64(md.NumPending))
	}
}

func seq(md *jetstream.MsgMetadata) uint64 {
	if md == nil {
		return 0
	}
	return md.Sequence.Stream
}

// post sends chunk until the destination answers it or refuses it with a
// 4xx other than 429; network errors, 429 and 5xx are retried with backoff,
// the messages kept in progress meanwhile.
func (b *Bridge) post(ctx context.Context, chunk []jetstream.Msg) error {
	body, err := encodeBatch(chunk)
	if err != nil {
		return err
	}
	backoff := b.cfg.MinBackoff
	for {
		results, err := b.send(ctx, body, len(chunk))
		if err == nil {
			for _, r := range results {
				b.metrics.answered(r)
			}
			return nil
		}
		var re *retryError
		if !errors.As(err, &re) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := backoff
		if re.after > 0 {
			wait = re.after
		}
		b.metrics.retries.WithLabelValues(re.reason).Inc()
		b.log.Warn("bridge: the destination did not take a batch; retrying", "messages", len(chunk), "in", wait, "err", err)
		for _, m := range chunk {
			_ = m.InProgress()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		backoff = min(2*backoff, b.cfg.MaxBackoff)
	}
}

// result is one message's answer from the transport endpoint
// (docs/ingest.md, Intake).
type result struct {
	MessageID schema.Bytes         `json:"message_id"`
	Status    schema.OutcomeStatus `json:"status"`
	Category  schema.Category      `json:"category,omitempty"`
}
