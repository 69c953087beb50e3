package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/quota"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Service is one ingest worker. Any number of them may run against one NATS
// deployment: they keep no state that another worker needs.
type Service struct {
	cfg   Config
	log   *slog.Logger
	m     *metrics
	js    jetstream.JetStream
	pub   *batchPublisher // the inputs' writes
	dir   *directory
	retry *retrier
	// backfillLocks serialize each group's backfill of retained input.
	backfillLocks *backfillLocks
	limiter       *quota.Buckets // transport messages per tenant
	bytes         *quota.Buckets // payload bytes per tenant
	reading       *bytesInFlight

	// Set by Start.
	retainedStream jetstream.Stream
	sub            *nats.Subscription

	started   atomic.Bool
	ready     chan struct{} // closed when Start has returned nil
	draining  atomic.Bool
	watchLost atomic.Bool
	inflight  *tracker
	slots     chan struct{} // bounds concurrent NATS intake requests

	stop context.CancelFunc
	bg   sync.WaitGroup // watchers and the retrier
}

// New returns a Service for cfg. It does no I/O; Start connects it to its
// streams and buckets.
func New(cfg Config) (*Service, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	opts := []jetstream.JetStreamOpt{
		jetstream.WithPublishAsyncMaxPending(16384),
		jetstream.WithPublishAsyncTimeout(10 * time.Second),
	}
	var js jetstream.JetStream
	if cfg.Domain != "" {
		js, err = jetstream.NewWithDomain(cfg.Conn, cfg.Domain, opts...)
	} else {
		js, err = jetstream.New(cfg.Conn, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("ingest: jetstream: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("ingest: register metrics: %w", err)
	}
	s := &Service{
		cfg:           cfg,
		log:           cfg.Logger,
		m:             m,
		js:            js,
		pub:           newBatchPublisher(cfg.Conn),
		dir:           newDirectory(),
		retry:         newRetrier(),
		backfillLocks: newBackfillLocks(),
		limiter:       quota.NewBuckets(cfg.Limits.RatePerTenant, cfg.Limits.BurstPerTenant),
		bytes:         quota.NewBuckets(cfg.Limits.ByteRatePerTenant, int(max(cfg.Limits.MaxBodyBytes, int64(cfg.Limits.ByteRatePerTenant)))),
		reading:       &bytesInFlight{max: cfg.Limits.MaxBytesInFlight},
		slots:         make(chan struct{}, cfg.NATSWorkers),
		inflight:      newTracker(),
		ready:         make(chan struct{}),
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(retainedCollector{s}); err != nil {
			return nil, fmt.Errorf("ingest: register metrics: %w", err)
		}
	}
	return s, nil
}

// Start binds the service to FABRIC_IN, FABRIC_OUTCOMES, FABRIC_RETAINED and
// the fabric-group-keys and fabric-groups buckets (provisioned
// by internal/bus/streams), loads the key sets and hosted groups, and starts
// the watches, the retrier and, if configured, NATS intake. It returns once
// the worker is ready to take input.
func (s *Service) Start(ctx context.Context) error {
	if s.started.Load() {
		return errors.New("ingest: already started")
	}
	var err error
	if _, err = s.js.Stream(ctx, streamIn); err != nil {
		return fmt.Errorf("ingest: stream %s: %w", streamIn, err)
	}
	if _, err = s.js.Stream(ctx, streamOutcomes); err != nil {
		return fmt.Errorf("ingest: stream %s: %w", streamOutcomes, err)
	}
	if s.retainedStream, err = s.js.Stream(ctx, streamRetained); err != nil {
		return fmt.Errorf("ingest: stream %s: %w", streamRetained, err)
	}
	keysKV, err := s.js.KeyValue(ctx, bucketKeys)
	if err != nil {
		return fmt.Errorf("ingest: bucket %s: %w", bucketKeys, err)
	}
	groupsKV, err := s.js.KeyValue(ctx, bucketGroups)
	if err != nil {
		return fmt.Errorf("ingest: bucket %s: %w", bucketGroups, err)
	}

	runCtx, stop := context.WithCancel(context.Background())
	s.stop = stop
	keysReady, groupsReady := make(chan struct{}), make(chan struct{})
	kw, err := keysKV.WatchAll(runCtx)
	if err != nil {
		stop()
		return fmt.Errorf("ingest: watch %s: %w", bucketKeys, err)
	}
	gw, err := groupsKV.WatchAll(runCtx)
	if err != nil {
		_ = kw.Stop()
		stop()
		return fmt.Errorf("ingest: watch %s: %w", bucketGroups, err)
	}
	if err := s.pub.start(); err != nil {
		_ = kw.Stop()
		_ = gw.Stop()
		stop()
		return fmt.Errorf("ingest: %w", err)
	}
	s.bg.Add(4)
	go func() { defer s.bg.Done(); s.runOutbound(runCtx) }()
	go func() { defer s.bg.Done(); s.watchKV(runCtx, kw, s.applyGroupKeys, keysReady) }()
	go func() { defer s.bg.Done(); s.watchKV(runCtx, gw, s.applyGroup, groupsReady) }()
	go func() { defer s.bg.Done(); s.runRetries(runCtx) }()
	for _, ch := range []chan struct{}{keysReady, groupsReady} {
		select {
		case <-ch:
		case <-ctx.Done():
			s.halt()
			return fmt.Errorf("ingest: loading watches: %w", ctx.Err())
		}
	}
	if err := s.sweepRetained(ctx); err != nil {
		s.halt()
		return fmt.Errorf("ingest: sweep retained: %w", err)
	}
	if s.cfg.NATSIntake {
		sub, err := s.cfg.Conn.QueueSubscribe(subject.IntakePattern, s.cfg.QueueGroup, s.handleNATS)
		if err != nil {
			s.halt()
			return fmt.Errorf("ingest: subscribe intake: %w", err)
		}
		// Ready means the server routes intake here: the subscription
		// must have reached it, or a request right after Start finds no
		// responder.
		// A flush needs a deadline; the caller's ctx may be the service's
		// lifetime, with none.
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = s.cfg.Conn.FlushWithContext(fctx)
		cancel()
		if err != nil {
			_ = sub.Unsubscribe()
			s.halt()
			return fmt.Errorf("ingest: subscribe intake: %w", err)
		}
		s.sub = sub
	}
	s.started.Store(true)
	close(s.ready)
	return nil
}

// Run is the worker's lifecycle (ops.Component): it starts the worker,
// takes input until ctx ends, then drains it (Shutdown, bounded by
// Config.DrainTimeout) and returns.
func (s *Service) Run(ctx context.Context) error {
	if err := s.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.DrainTimeout)
	defer cancel()
	if err := s.Shutdown(dctx); err != nil {
		return fmt.Errorf("ingest: drain: %w", err)
	}
	return nil
}

// Started is closed once the worker takes input.
func (s *Service) Started() <-chan struct{} { return s.ready }

func (s *Service) halt() {
	s.stop()
	s.bg.Wait()
	s.pub.stop()
}

// Ready reports whether the worker takes input: started and not draining.
func (s *Service) Ready() error {
	switch {
	case !s.started.Load():
		return errors.New("ingest: not started")
	case s.draining.Load():
		return errors.New("ingest: draining")
	case !s.cfg.Conn.IsConnected():
		return errors.New("ingest: NATS disconnected")
	case s.watchLost.Load():
		return errors.New("ingest: a KV watch ended")
	}
	return nil
}

// Shutdown drains the worker: it stops taking new requests, lets every
// request in flight finish (so nothing acknowledged is lost), then stops
// the watches and the retrier. It returns ctx's error if ctx ends first.
func (s *Service) Shutdown(ctx context.Context) error {
	if !s.draining.CompareAndSwap(false, true) {
		return nil
	}
	if s.sub != nil {
		if err := s.sub.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			s.log.Warn("draining intake subscription", "err", err)
		}
		for s.sub.IsValid() {
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return err
			}
		}
	}
	if err := s.inflight.close(ctx); err != nil {
		return err
	}
	if s.stop != nil {
		s.halt()
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Submit processes transport messages for a tenant, as both intake
// transports do after authentication, and returns one result per message in
// input order. transport labels the metrics ("http", "nats" or another
// short constant). The caller's limits apply: a tenant over its rate gets
// ErrRateLimited or ErrByteRateLimited, one whose input stored on
// FABRIC_IN is at Config.InputBytes' bound ErrInputQuota; a full input
// stream ErrStorageFull;
// a worker not taking input or unable to store it ErrUnavailable. Once started, processing runs to the end even if ctx
// is cancelled, so an input is never left half-admitted; an error means
// nothing was acknowledged and the whole request may be retried.
func (s *Service) Submit(ctx context.Context, tenant, transport string, msgs []schema.TransportMessage) ([]Result, error) {
	if s.draining.Load() || !s.started.Load() {
		return nil, ErrUnavailable
	}
	now := time.Now()
	if ok, wait := s.limiter.Take(tenant, len(msgs), now); !ok {
		return nil, ErrRateLimited.With("tenant over its rate of %g messages per second", s.cfg.Limits.RatePerTenant).After(wait)
	}
	var size int
	for i := range msgs {
		size += len(msgs[i].Payload)
	}
	if ok, wait := s.bytes.Take(tenant, size, now); !ok {
		return nil, ErrByteRateLimited.With("tenant over its rate of %g payload bytes per second", s.cfg.Limits.ByteRatePerTenant).After(wait)
	}
	// Counted before it is stored, so that requests at once cannot pass
	// the bound together; what is not stored on FABRIC_IN is given back.
	if ok, wait := s.cfg.InputBytes.Take(tenant, int64(size), now); !ok {
		return nil, ErrInputQuota.With("the tenant's input stored on FABRIC_IN within its retention is at its bound of %d bytes", s.cfg.InputBytes.Max()).After(wait)
	}
	stored := false
	defer func() {
		if !stored {
			s.cfg.InputBytes.Return(tenant, int64(size), now)
		}
	}()
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ProcessTimeout)
	defer cancel()
	start := time.Now()
	// One allocation for the request's inputs, not one each.
	all := make([]input, len(msgs))
	ins := make([]*input, len(msgs))
	for i := range msgs {
		all[i].msg = msgs[i]
		ins[i] = &all[i]
	}
	s.m.bytes.WithLabelValues(transport).Add(float64(size))
	s.prepareAll(tenant, ins)
	s.m.stage.WithLabelValues("peel").Observe(time.Since(start).Seconds())
	if err := s.run(pctx, tenant, ins); err != nil {
		if storeFull(err) {
			s.log.Warn("ingest: a stream is full", "err", err)
			return nil, ErrStorageFull
		}
		s.log.Error("ingest request failed", "transport", transport, "messages", len(msgs), "err", err)
		return nil, ErrUnavailable.With("input could not be stored; nothing was acknowledged, retry the request")
	}
	results := make([]Result, len(ins))
	var unstored int
	for i, in := range ins {
		results[i] = in.res
		if in.res.Status != schema.StatusQueued {
			unstored += len(in.msg.Payload)
		}
	}
	stored = true
	s.cfg.InputBytes.Return(tenant, int64(unstored), now)
	s.count(transport, ins)
	return results, nil
}

// count adds a request's inputs to the inputs metric, one update per label
// set rather than one per input.
func (s *Service) count(transport string, ins []*input) {
	type labels struct {
		class    schema.InputClass
		status   schema.OutcomeStatus
		category schema.Category
	}
	n := make(map[labels]int, 2)
	for _, in := range ins {
		n[labels{in.class, in.res.Status, in.res.Category}]++
	}
	for l, c := range n {
		s.m.inputs.WithLabelValues(transport, string(l.class), string(l.status), string(l.category)).Add(float64(c))
	}
}
