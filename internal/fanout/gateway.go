package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/fanout/queue"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// Defaults of Config.
const (
	DefaultMaxSubscriptions   = 256
	DefaultMaxFrameBytes      = 64 << 10
	DefaultWriteTimeout       = 10 * time.Second
	DefaultPingInterval       = 30 * time.Second
	DefaultRequestTimeout     = 5 * time.Second
	DefaultConnectTimeout     = 10 * time.Second
	DefaultMaxRepair          = 10000
	DefaultHealInterval       = time.Second
	hardFrameLimit            = 1 << 20
	defaultWriterBatch        = 64
	defaultShutdownDrainDelay = 5 * time.Second
)

// Config configures a Gateway.
type Config struct {
	// NATS is the connection taps subscribe on and direct gets go through.
	// Required. The gateway does not close it.
	NATS *nats.Conn
	// JetStream is NATS's JetStream context, whose domain or API prefix
	// the gateway's reads of the events stream and of records use; nil
	// uses NATS's local JetStream.
	JetStream jetstream.JetStream
	// Verifier checks bearer tokens. Required.
	Verifier *auth.Verifier
	// TokenSecret signs the connection tokens the gateway mints (HS256,
	// the secret Verifier accepts); without it POST connection-tokens
	// answers 501.
	TokenSecret []byte
	// MaxConnectionTokenTTL bounds a minted connection token's lifetime;
	// DefaultMaxConnectionTokenTTL when 0.
	MaxConnectionTokenTTL time.Duration
	// AllowQueryToken accepts SSE's access_token query parameter (RFC 6750
	// §2.3), for EventSource, which cannot set headers. Off by default: a
	// token in a URL lands in access logs and proxies' histories.
	AllowQueryToken bool
	// DMKeys resolves filter group ids to stitched-DM conversation keys at
	// subscribe time; a group stitched later is learnt from the events.
	// Nil reads the fabric-groups KV bucket (KVDMKeys).
	DMKeys DMResolver
	// Registry receives the gateway's metrics and is served on /metrics.
	// Nil uses a fresh registry.
	Registry *prometheus.Registry
	// Logger receives operational logs; nil uses slog.Default().
	Logger *slog.Logger
	// Listen is the address Run serves on; none when empty.
	Listen string
	// DrainTimeout bounds Run's drain once its context ends: connections
	// still open then are closed. 5 s when zero.
	DrainTimeout time.Duration
	// OriginPatterns are the browser origins (host patterns, as
	// path.Match) allowed to open a WebSocket besides the gateway's own
	// host. Requests without an Origin header, from non-browser clients,
	// are always allowed.
	OriginPatterns []string

	// Stream is the events stream gaps are repaired from;
	// streams.StreamEvents when empty.
	Stream string
	// QueueCapacity is the bound per subscription (EVENT-030).
	QueueCapacity int
	// MaxSubscriptions bounds the subscriptions of one WebSocket.
	MaxSubscriptions int
	// MaxFrameBytes bounds an incoming frame.
	MaxFrameBytes int
	// WriteTimeout bounds one frame write; a connection that does not read
	// for that long is closed.
	WriteTimeout time.Duration
	// PingInterval is the WebSocket keepalive period.
	PingInterval time.Duration
	// ConnectTimeout is how long a WebSocket opened without an
	// Authorization header has to send its connect frame.
	ConnectTimeout time.Duration
	// RequestTimeout bounds one NATS request (direct get, KV read).
	RequestTimeout time.Duration
	// MaxRepair bounds the events handed off to repair one gap; beyond it
	// the rest are read only to count, per subscription, those its filter
	// selects as discarded (EVENT-031).
	MaxRepair int
	// MaxConnsPerTenant bounds one tenant's open connections;
	// DefaultMaxConnsPerTenant when 0, none when negative.
	MaxConnsPerTenant int
	// MaxReplay bounds the stored events handed off to resume one
	// subscription; the rest are counted as for MaxRepair. DefaultMaxReplay
	// when 0.
	MaxReplay int
	// ReplayRate and ReplayBurst bound the stored events per second one
	// tenant may have read to resume subscriptions (a token bucket); the
	// defaults when 0, no bound when ReplayRate is negative.
	ReplayRate  float64
	ReplayBurst int
	// HealInterval is how often the gateway checks whether its NATS
	// connection reconnected; after a reconnect every tap is compared with
	// the stream and repaired, since republished events sent while it was
	// away are lost and no later event may come to reveal the gap.
	HealInterval time.Duration
}

func (c *Config) setDefaults() {
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = defaultShutdownDrainDelay
	}
	if c.Stream == "" {
		c.Stream = streams.StreamEvents
	}
	if c.QueueCapacity <= 0 {
		c.QueueCapacity = queue.DefaultCapacity
	}
	if c.MaxSubscriptions <= 0 {
		c.MaxSubscriptions = DefaultMaxSubscriptions
	}
	if c.MaxFrameBytes <= 0 {
		c.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.PingInterval <= 0 {
		c.PingInterval = DefaultPingInterval
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.MaxRepair <= 0 {
		c.MaxRepair = DefaultMaxRepair
	}
	if c.MaxConnsPerTenant == 0 {
		c.MaxConnsPerTenant = DefaultMaxConnsPerTenant
	}
	if c.MaxReplay <= 0 {
		c.MaxReplay = DefaultMaxReplay
	}
	if c.ReplayRate == 0 {
		c.ReplayRate = DefaultReplayRate
	}
	if c.ReplayBurst <= 0 {
		c.ReplayBurst = max(DefaultReplayBurst, c.MaxReplay)
	}
	if c.MaxConnectionTokenTTL <= 0 {
		c.MaxConnectionTokenTTL = DefaultMaxConnectionTokenTTL
	}
	if c.HealInterval <= 0 {
		c.HealInterval = DefaultHealInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
}

// Routes the gateway serves, as net/http ServeMux patterns, for mounting
// Handler on a role's own server.
const (
	RouteWebSocket = "GET /v1/events"
	RouteSSE       = "GET /v1/tenants/{tenant}/clients/{client_id}/events"
	// RouteConnectionTokens mints short-lived connection tokens a backend
	// hands to its page.
	RouteConnectionTokens = "POST /v1/tenants/{tenant}/connection-tokens"
	// RouteSubscriptions lists a tenant's live subscriptions on this
	// gateway, for the operator's console.
	RouteSubscriptions = "GET /v1/tenants/{tenant}/subscriptions"
)

// ErrDraining refuses new work once Shutdown has begun.
var ErrDraining = errors.New("fanout: gateway is draining")

// Gateway serves live client events. Create it with New.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	dm      DMResolver
	metrics *metrics
	quotas  *quotas
	mux     *http.ServeMux

	tapsMu sync.Mutex
	taps   map[string]*tap

	connsMu  sync.Mutex
	conns    map[*conn]struct{}
	draining bool
	connWG   sync.WaitGroup
	// served counts the goroutines serving accepted WebSockets (serveConn),
	// connected or still waiting for their connect frame; stopping ends
	// that wait when the gateway drains.
	served        sync.WaitGroup
	stopping      context.Context
	beginStopping context.CancelFunc

	done     chan struct{} // closed by Shutdown: background work stops
	stopOnce sync.Once
	bg       sync.WaitGroup
}

// New returns a Gateway. It registers its metrics on cfg.Registry and
// starts a background check that Shutdown stops.
func New(cfg Config) (*Gateway, error) {
	if cfg.NATS == nil {
		return nil, errors.New("fanout: Config.NATS is required")
	}
	if cfg.Verifier == nil {
		return nil, errors.New("fanout: Config.Verifier is required")
	}
	cfg.setDefaults()
	if cfg.JetStream == nil {
		js, err := jetstream.New(cfg.NATS)
		if err != nil {
			return nil, fmt.Errorf("fanout: jetstream: %w", err)
		}
		cfg.JetStream = js
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("fanout: register metrics: %w", err)
	}
	g := &Gateway{
		cfg:     cfg,
		log:     cfg.Logger,
		dm:      cfg.DMKeys,
		metrics: m,
		quotas:  newQuotas(&cfg),
		taps:    make(map[string]*tap),
		conns:   make(map[*conn]struct{}),
		done:    make(chan struct{}),
	}
	g.stopping, g.beginStopping = context.WithCancel(context.Background())
	if g.dm == nil {
		g.dm = &KVDMKeys{JetStream: cfg.JetStream, Timeout: cfg.RequestTimeout}
	}
	mux := http.NewServeMux()
	mux.HandleFunc(RouteWebSocket, g.serveWS)
	mux.HandleFunc(RouteSSE, g.serveSSE)
	mux.HandleFunc(RouteConnectionTokens, g.serveConnectionToken)
	mux.HandleFunc(RouteSubscriptions, g.serveSubscriptions)
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{Registry: cfg.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", g.serveReady)
	g.mux = mux
	return g, nil
}

// Mount serves Handler on the gateway's API routes of mux, the one list of
// them for cmd/fanout and the all-in-one.
func (g *Gateway) Mount(mux interface{ Handle(string, http.Handler) }) {
	for _, p := range []string{RouteWebSocket, RouteSSE, RouteConnectionTokens, RouteSubscriptions} {
		mux.Handle(p, g.mux)
	}
}

// Handler serves the event endpoints, /metrics, /healthz and /readyz.
func (g *Gateway) Handler() http.Handler { return g.mux }

// Ready reports whether the gateway can take subscriptions: not draining and
// connected to NATS.
func (g *Gateway) Ready(context.Context) error {
	g.connsMu.Lock()
	draining := g.draining
	g.connsMu.Unlock()
	if draining {
		return ErrDraining
	}
	if !g.cfg.NATS.IsConnected() {
		return errors.New("fanout: not connected to NATS")
	}
	return nil
}

func (g *Gateway) serveReady(w http.ResponseWriter, r *http.Request) {
	if err := g.Ready(r.Context()); err != nil {
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// Run serves Handler on cfg.Listen until ctx ends, then drains: it ends every
// subscription with reason shutdown and closes every connection, waiting at
// most cfg.DrainTimeout. With cfg.Listen empty it serves nothing itself (a
// role's own server mounts Handler) and only drains when ctx ends. While it
// runs, taps are repaired after a NATS reconnect.
func (g *Gateway) Run(ctx context.Context) error {
	// The heal loop is Run's; a Shutdown that began first (draining set
	// under the lock, before it waits for bg) has nothing to wait for.
	g.connsMu.Lock()
	if !g.draining {
		g.bg.Go(g.healLoop)
	}
	g.connsMu.Unlock()
	if g.cfg.Listen == "" {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.DrainTimeout)
		defer cancel()
		return g.Shutdown(sctx)
	}
	ln, err := net.Listen("tcp", g.cfg.Listen)
	if err != nil {
		return fmt.Errorf("fanout: listen: %w", err)
	}
	srv := &http.Server{Handler: g.mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("fanout: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.DrainTimeout)
	defer cancel()
	serr := g.Shutdown(sctx)
	herr := srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		g.log.Error("fanout http server", "err", err)
	}
	return errors.Join(serr, herr)
}

// Shutdown drains the gateway: new connections and subscriptions are
// refused, every subscription ends with reason shutdown, each connection
// writes what it has queued for its control frames and closes. It waits for
// the connections to finish or ctx to end, then closes what remains.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.connsMu.Lock()
	g.draining = true
	conns := make([]*conn, 0, len(g.conns))
	for c := range g.conns {
		conns = append(conns, c)
	}
	g.connsMu.Unlock()
	g.stopOnce.Do(func() { close(g.done) })
	g.beginStopping()
	g.bg.Wait()
	for _, c := range conns {
		c.drain(wire.ReasonShutdown)
	}
	done := make(chan struct{})
	go func() { g.connWG.Wait(); g.served.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	for _, c := range conns {
		c.abort()
	}
	<-done
	return fmt.Errorf("fanout: shutdown: %w", ctx.Err())
}

// healLoop repairs every tap after the NATS connection reconnects.
func (g *Gateway) healLoop() {
	t := time.NewTicker(g.cfg.HealInterval)
	defer t.Stop()
	last := g.cfg.NATS.Stats().Reconnects
	for {
		select {
		case <-g.done:
			return
		case <-t.C:
		}
		if r := g.cfg.NATS.Stats().Reconnects; r != last && g.cfg.NATS.IsConnected() {
			last = r
			g.heal()
		}
	}
}

// heal compares each tap with the last event stored for its client and
// repairs what it missed.
func (g *Gateway) heal() {
	g.tapsMu.Lock()
	taps := make([]*tap, 0, len(g.taps))
	for _, t := range g.taps {
		taps = append(taps, t)
	}
	g.tapsMu.Unlock()
	for _, t := range taps {
		t.heal()
	}
}

// admitConn counts a connection of tenant against its quota, or refuses it;
// releaseConn undoes it when the connection ends.
func (g *Gateway) admitConn(tenant string) error {
	err := g.quotas.admitConn(tenant)
	if err != nil {
		g.metrics.refusals.WithLabelValues(CodeTooManyConnections).Inc()
	}
	return err
}

func (g *Gateway) releaseConn(tenant string) { g.quotas.releaseConn(tenant) }

// serve runs serveConn for an accepted WebSocket on a goroutine Shutdown
// waits for, unless the gateway is draining.
func (g *Gateway) serve(fn func()) bool {
	g.connsMu.Lock()
	defer g.connsMu.Unlock()
	if g.draining {
		return false
	}
	g.served.Add(1)
	go func() {
		defer g.served.Done()
		fn()
	}()
	return true
}

// addConn registers a connection unless the gateway is draining.
func (g *Gateway) addConn(c *conn) bool {
	g.connsMu.Lock()
	defer g.connsMu.Unlock()
	if g.draining {
		return false
	}
	g.conns[c] = struct{}{}
	g.connWG.Add(1)
	g.metrics.connections.WithLabelValues(c.transport()).Inc()
	return true
}

func (g *Gateway) removeConn(c *conn) {
	g.connsMu.Lock()
	delete(g.conns, c)
	g.connsMu.Unlock()
	g.metrics.connections.WithLabelValues(c.transport()).Dec()
	g.connWG.Done()
}
