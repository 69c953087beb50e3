// Command ingest is the ingest role: it takes transport messages over HTTP
// (POST /v1/tenants/{tenant}/transport) and NATS (fabric.intake.<tenant>,
// queue group "ingest"), peels, classifies and deduplicates them, records
// every outcome, and publishes what enters convergence onto
// fabric.in.<tenant>.<group>.<message_id>. Workers are stateless: run as many as the load
// needs. See docs/ingest.md.
//
// Configuration is by flags, each with a FABRIC_ environment variable:
//
//	-nats-url            NATS server URLs (FABRIC_NATS_URL)
//	-listen              address of the API, /metrics, /healthz and /readyz
//	-max-conns, -max-conns-per-addr, -idle-timeout  HTTP connection limits, as fabric run's
//	-jwt-secret-file     file with the HS256 secret; else FABRIC_JWT_SECRET
//	-tenant-keys         JSON file of each tenant's EdDSA/ES256 keys or JWKS URL, issuer and audience
//	-jwks-ttl            how long fetched JWKS keys are used (10m)
//	-jwks-min-refetch    shortest time between two fetches of a tenant's JWKS (30s)
//	-max-token-lifetime  longest a token may still be valid, per scope (admin=168h,events=720h,ingest=720h,signals=720h)
//	-max-body            largest request body, bytes
//	-max-batch           most transport messages per request
//	-max-message         largest transport payload, bytes
//	-rate                transport messages per second per tenant (-1: off)
//	-burst               token bucket size per tenant
//	-max-retained        retained objects per tenant before resource_refused
//	-max-bytes-in-flight request bodies read at once, bytes
//	-byte-rate           payload bytes per second per tenant (-1: off)
//	-tenant-input-bytes  bytes a tenant may store on FABRIC_IN through this process within its MaxAge (1 GiB; -1: off)
//	-op-rate, -op-burst, -op-byte-rate       operation requests and stored bytes per second per tenant (50/s, burst 100; 1 MiB/s)
//	-read-rate, -read-burst, -read-byte-rate read API requests and answer bytes per second per tenant (100/s, burst 200; 4 MiB/s)
//	-read-page-bytes     bytes of one page of messages (4 MiB)
//	-read-inflight-bytes bytes of stored records one tenant's reads hold at once (4 MiB; -1: off)
//	-nats-intake         serve fabric.intake.<tenant>
//	-nats-require-token  NATS intake needs a bearer token too
//	-client-api          serve the client stores, signals and operations API too
//	-allowed-origins     browser origins whose pages may call the read API (host patterns)
//	-master-key-file     file with the master key; else FABRIC_MASTER_KEY
//	-drain-timeout       how long SIGTERM waits for requests in flight
//
// Ingest needs the master key: converge seals the group event keys it peels
// transport messages with (fabric-group-keys), and the client API seals
// hosted clients' private keys. With -client-api (the default) ingest is the
// fabric's whole front door: it also serves hosted client registration,
// consent, HMAC keys, identity association states (docs/client-stores.md)
// and local-change signals.
//
// Secrets are read from the environment or a file, never from a flag value. SIGTERM or SIGINT drains: no new request is taken,
// requests in flight finish, and only then does the process exit, so nothing
// it acknowledged is lost.
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
	"github.com/fabric-mls/fabric/internal/bridge"
	"github.com/fabric-mls/fabric/internal/clientapi"
	"github.com/fabric-mls/fabric/internal/config"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/ingest"
	"github.com/fabric-mls/fabric/internal/ops"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	slog.SetDefault(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], log)
	stop()
	if errors.Is(err, config.ErrReported) {
		os.Exit(2)
	}
	if err != nil {
		log.Error("ingest stopped", "err", err)
		os.Exit(1)
	}
}

type options struct {
	nats         config.NATS
	listen       string
	limits       ops.Limits
	auth         config.Auth
	maxBody      int
	maxBatch     int
	maxMessage   int
	rate         int
	burst        int
	maxRetained  int
	inFlight     int
	byteRate     int
	natsIntake   bool
	requireToken bool
	clientAPI    bool
	originsFlag  string
	origins      []string
	keyFile      string
	drain        time.Duration
	quotas       config.Quotas
}

// secrets are what parse read from the environment or files.
type secrets struct {
	jwt       []byte // nil when only tenant keys are configured
	verifier  *auth.Verifier
	masterKey []byte
}

func parse(args []string) (options, secrets, error) {
	var o options
	var errs config.Errs
	fs := flag.NewFlagSet("ingest", flag.ContinueOnError)
	o.nats.RegisterFlags(fs, &errs)
	config.Listen(fs, &o.listen, ":8081")
	config.HTTPLimits(fs, &errs, &o.limits)
	o.auth.RegisterFlags(fs, &errs)
	config.Int(fs, &errs, &o.maxBody, "max-body", ingest.DefaultMaxBodyBytes, "largest request body in bytes")
	config.Int(fs, &errs, &o.maxBatch, "max-batch", ingest.DefaultMaxBatch, "most transport messages in one request")
	config.Int(fs, &errs, &o.maxMessage, "max-message", ingest.DefaultMaxMessageBytes, "largest transport payload in bytes")
	config.Int(fs, &errs, &o.rate, "rate", ingest.DefaultRatePerTenant, "transport messages per second per tenant; -1 turns the limit off")
	config.Int(fs, &errs, &o.burst, "burst", 0, "token bucket size per tenant; 0 is the larger of -max-batch and -rate")
	config.Int(fs, &errs, &o.inFlight, "max-bytes-in-flight", ingest.DefaultMaxBytesInFlight, "request body bytes read and processed at once; past it 503 overloaded")
	config.Int(fs, &errs, &o.byteRate, "byte-rate", ingest.DefaultByteRatePerTenant, "payload bytes per second per tenant; past it 429 byte_rate_limited; -1 turns the limit off")
	config.Int(fs, &errs, &o.maxRetained, "max-retained", ingest.DefaultMaxRetainedPerTenant, "retained objects per tenant before input is refused with resource_refused")
	o.quotas.RegisterFlags(fs, &errs)
	config.Bool(fs, &errs, &o.natsIntake, "nats-intake", true, "serve NATS intake on fabric.intake.<tenant>")
	config.Bool(fs, &errs, &o.requireToken, "nats-require-token", false, "require a bearer token on NATS intake as on HTTP")
	config.Bool(fs, &errs, &o.clientAPI, "client-api", true, "serve client registration, the client stores, signals and operations")
	config.Origins(fs, &o.originsFlag)
	config.String(fs, &o.keyFile, "master-key-file", "", "file holding the master key as 64 hex digits (else FABRIC_MASTER_KEY)")
	config.Duration(fs, &errs, &o.drain, "drain-timeout", 30*time.Second, "how long a stop waits for requests in flight")
	if err := config.Parse(fs, args); err != nil {
		return o, secrets{}, err
	}
	o.nats.Validate(&errs)
	config.ValidateListen(&errs, o.listen)
	o.origins = config.ParseOrigins(&errs, o.originsFlag)
	o.quotas.Validate(&errs)
	for _, v := range []struct {
		name string
		n    int
	}{{"-max-body", o.maxBody}, {"-max-batch", o.maxBatch}, {"-max-message", o.maxMessage}, {"-max-retained", o.maxRetained}} {
		if v.n <= 0 {
			errs.Addf("%s: %d; it must be positive", v.name, v.n)
		}
	}
	if o.rate == 0 || o.rate < -1 {
		errs.Addf("-rate: %d; use a positive rate or -1 for none", o.rate)
	}
	if o.burst < 0 {
		errs.Addf("-burst: %d; it must not be negative", o.burst)
	}
	if o.drain <= 0 {
		errs.Addf("-drain-timeout: %v; it must be positive", o.drain)
	}
	// The master key opens the sealed fabric-group-keys even without
	// -client-api.
	var sec secrets
	sec.verifier, sec.jwt = o.auth.Verifier(&errs)
	sec.masterKey = config.MasterKey(&errs, o.keyFile)
	return o, sec, errs.Err()
}

// run serves until ctx ends (SIGTERM or SIGINT in main), then drains.
func run(ctx context.Context, args []string, log *slog.Logger) error {
	o, sec, err := parse(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}

	verifier := sec.verifier
	vault, err := engine.NewVault(sec.masterKey)
	if err != nil {
		return err
	}
	nc, js, err := o.nats.ConnectJetStream(ctx, "ingest")
	if err != nil {
		return err
	}
	defer nc.Close()
	tenantInput, err := o.quotas.TenantInput(ctx, js)
	if err != nil {
		return err
	}
	reg := ops.NewRegistry()
	svc, err := ingest.New(ingest.Config{
		Conn:     nc,
		Domain:   o.nats.Domain,
		Verifier: verifier,
		Vault:    vault,
		Limits: ingest.Limits{
			MaxBodyBytes:         int64(o.maxBody),
			MaxBatch:             o.maxBatch,
			MaxMessageBytes:      o.maxMessage,
			RatePerTenant:        float64(o.rate),
			BurstPerTenant:       o.burst,
			MaxRetainedPerTenant: o.maxRetained,
			MaxBytesInFlight:     int64(o.inFlight),
			ByteRatePerTenant:    float64(o.byteRate),
		},
		InputBytes:       tenantInput,
		NATSIntake:       o.natsIntake,
		NATSRequireToken: o.requireToken,
		DrainTimeout:     o.drain,
		Logger:           log,
		Registerer:       reg,
	})
	if err != nil {
		return err
	}
	parts := []ops.Component{svc}
	if o.natsIntake {
		// Bridges ask the NATS-facing workers for their consumers (issue 27).
		parts = append(parts, bridge.NewProvisioner(js, log))
	}
	var api *clientapi.API
	if o.clientAPI {
		if api, err = clientapi.New(ctx, clientapi.Config{JS: js, Vault: vault, Verifier: verifier, OriginPatterns: o.origins, Logger: log, Registerer: reg, Quotas: o.quotas.ClientAPI(tenantInput)}); err != nil {
			return err
		}
		parts = append(parts, api)
	}
	srv, err := ops.NewWithLimits(o.listen, reg, o.limits)
	if err != nil {
		return err
	}
	svc.Mount(srv)
	if api != nil {
		api.Mount(srv)
	}
	srv.AddReady(func(context.Context) error { return svc.Ready() })
	log.Info("ingest started", "listen", srv.Addr(), "nats_intake", o.natsIntake)

	// When ctx ends, the HTTP server stops taking requests and lets those
	// in flight finish while the worker drains its NATS intake and its
	// requests in flight; Run returns when all have.
	err = ops.Run(ctx, append(parts, srv.Serving(o.drain))...)
	log.Info("ingest drained")
	return err
}
