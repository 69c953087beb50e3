// Command fanout is the gateway role: apps connect to it for live client
// events over WebSocket (GET /v1/events, subprotocols fabric.v1.json and
// fabric.v1.msgpack) or Server-Sent Events
// (GET /v1/tenants/{tenant}/clients/{client_id}/events). It taps the
// republished event subjects of FABRIC_EVENTS; run as many as the load
// needs, each one independent.
//
// Configuration is by flags, each with a FABRIC_ environment variable:
//
//	-nats-url            NATS server URLs (FABRIC_NATS_URL)
//	-listen              address of the event endpoints, /metrics, /healthz and /readyz
//	-max-conns, -max-conns-per-addr, -idle-timeout  HTTP connection limits, as fabric run's
//	-jwt-secret-file     file with the HS256 secret; else FABRIC_JWT_SECRET
//	-tenant-keys         JSON file of each tenant's EdDSA/ES256 keys or JWKS URL, issuer and audience
//	-jwks-ttl            how long fetched JWKS keys are used (10m)
//	-jwks-min-refetch    shortest time between two fetches of a tenant's JWKS (30s)
//	-max-token-lifetime  longest a token may still be valid, per scope (admin=168h,events=720h,ingest=720h,signals=720h)
//	-sse-query-token     accept SSE's access_token query parameter (off: a token in a URL lands in access logs)
//	-max-connection-token-ttl  longest lifetime of a minted connection token (1h)
//	-allowed-origins     browser origins allowed to open a WebSocket (host patterns)
//	-console             serve the operator's console at /console/
//	-connect-timeout     how long a WebSocket without an Authorization header has to send its connect frame (10s)
//	-max-subscriptions   subscriptions per WebSocket
//	-max-frame           largest incoming frame, bytes
//	-write-timeout       a connection that does not read for this long is closed
//	-ping-interval       WebSocket keepalive period
//	-drain-timeout       how long SIGTERM waits for connections to end
//
// SIGTERM or SIGINT drains: readiness fails, every subscription ends with
// reason shutdown, and connections close; the SDK reconnects elsewhere and
// resumes.
package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/config"
	"github.com/fabric-mls/fabric/internal/console"
	"github.com/fabric-mls/fabric/internal/fanout"
	"github.com/fabric-mls/fabric/internal/ops"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	slog.SetDefault(log)
	err := run(os.Args[1:], log)
	if errors.Is(err, config.ErrReported) {
		os.Exit(2)
	}
	if err != nil {
		log.Error("fanout stopped", "err", err)
		os.Exit(1)
	}
}

type options struct {
	nats         config.NATS
	listen       string
	limits       ops.Limits
	auth         config.Auth
	queryToken   bool
	maxConnTTL   time.Duration
	connectWait  time.Duration
	console      bool
	originsFlag  string
	origins      []string
	maxSubs      int
	maxFrame     int
	writeTimeout time.Duration
	pingInterval time.Duration
	drain        time.Duration
	tenantConns  int
	maxReplay    int
	replayRate   int
}

// keys are what parse read from the environment and files to verify and
// mint tokens; secret is nil when only tenant keys are configured.
type keys struct {
	verifier *auth.Verifier
	secret   []byte
}

func parse(args []string) (options, keys, error) {
	var o options
	var errs config.Errs
	fs := flag.NewFlagSet("fanout", flag.ContinueOnError)
	o.nats.RegisterFlags(fs, &errs)
	config.Listen(fs, &o.listen, ":8083")
	config.HTTPLimits(fs, &errs, &o.limits)
	o.auth.RegisterFlags(fs, &errs)
	config.Bool(fs, &errs, &o.queryToken, "sse-query-token", false, "accept SSE's access_token query parameter (a token in a URL lands in access logs)")
	config.Duration(fs, &errs, &o.maxConnTTL, "max-connection-token-ttl", fanout.DefaultMaxConnectionTokenTTL, "longest lifetime of a connection token minted by POST /v1/tenants/{tenant}/connection-tokens")
	config.Origins(fs, &o.originsFlag)
	config.Bool(fs, &errs, &o.console, "console", false, "serve the operator's console at /console/ (it reads conversations from the read API, which fanout does not serve)")
	config.Duration(fs, &errs, &o.connectWait, "connect-timeout", fanout.DefaultConnectTimeout, "how long a WebSocket opened without an Authorization header has to send its connect frame")
	config.Int(fs, &errs, &o.maxSubs, "max-subscriptions", fanout.DefaultMaxSubscriptions, "subscriptions per WebSocket connection")
	config.Int(fs, &errs, &o.maxFrame, "max-frame", fanout.DefaultMaxFrameBytes, "largest incoming frame in bytes")
	config.Duration(fs, &errs, &o.writeTimeout, "write-timeout", fanout.DefaultWriteTimeout, "close a connection whose frame write takes longer")
	config.Duration(fs, &errs, &o.pingInterval, "ping-interval", fanout.DefaultPingInterval, "WebSocket keepalive period")
	config.Int(fs, &errs, &o.tenantConns, "max-conns-per-tenant", fanout.DefaultMaxConnsPerTenant, "open event connections of one tenant (-1: none)")
	config.Int(fs, &errs, &o.maxReplay, "max-replay", fanout.DefaultMaxReplay, "stored events handed off to resume one subscription; the rest are counted in one lagged")
	config.Int(fs, &errs, &o.replayRate, "replay-rate", fanout.DefaultReplayRate, "stored events per second one tenant may have replayed (-1: none)")
	config.Duration(fs, &errs, &o.drain, "drain-timeout", 30*time.Second, "how long a stop waits for connections to end")
	if err := config.Parse(fs, args); err != nil {
		return o, keys{}, err
	}
	o.nats.Validate(&errs)
	config.ValidateListen(&errs, o.listen)
	if o.maxSubs <= 0 {
		errs.Addf("-max-subscriptions: %d; it must be positive", o.maxSubs)
	}
	if o.maxFrame < 1024 {
		errs.Addf("-max-frame: %d; it must be at least 1024", o.maxFrame)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"-connect-timeout", o.connectWait}, {"-max-connection-token-ttl", o.maxConnTTL}, {"-write-timeout", o.writeTimeout}, {"-ping-interval", o.pingInterval}, {"-drain-timeout", o.drain}} {
		if d.v <= 0 {
			errs.Addf("%s: %v; it must be positive", d.name, d.v)
		}
	}
	o.origins = config.ParseOrigins(&errs, o.originsFlag)
	var k keys
	k.verifier, k.secret = o.auth.Verifier(&errs)
	return o, k, errs.Err()
}

func run(args []string, log *slog.Logger) error {
	o, k, err := parse(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	nc, js, err := o.nats.ConnectJetStream(ctx, "fanout")
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := ops.NewRegistry()
	g, err := fanout.New(fanout.Config{
		NATS:                  nc,
		JetStream:             js,
		Verifier:              k.verifier,
		TokenSecret:           k.secret,
		MaxConnectionTokenTTL: o.maxConnTTL,
		AllowQueryToken:       o.queryToken,
		ConnectTimeout:        o.connectWait,
		OriginPatterns:        o.origins,
		Registry:              reg,
		Logger:                log,
		MaxSubscriptions:      o.maxSubs,
		MaxFrameBytes:         o.maxFrame,
		WriteTimeout:          o.writeTimeout,
		PingInterval:          o.pingInterval,
		MaxConnsPerTenant:     o.tenantConns,
		MaxReplay:             o.maxReplay,
		ReplayRate:            float64(o.replayRate),
		DrainTimeout:          o.drain,
	})
	if err != nil {
		return err
	}
	srv, err := ops.NewWithLimits(o.listen, reg, o.limits)
	if err != nil {
		return err
	}
	g.Mount(srv)
	if o.console {
		srv.Handle(console.Route, console.Handler())
	}
	srv.AddReady(g.Ready)
	log.Info("fanout started", "listen", srv.Addr())

	// WebSockets outlive the HTTP server's drain (they are hijacked) and
	// SSE streams hold it open, so the gateway drains them itself, while
	// the server drains.
	err = ops.Run(ctx, g, srv.Serving(o.drain))
	log.Info("fanout drained")
	return err
}
