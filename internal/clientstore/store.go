// Package clientstore keeps the fabric's own per-client stores and emits the
// events they own (DESIGN §6): hosted client registration
// (identity.registered), consent (consent.changed), HMAC root keys and the
// observed HMAC epoch (hmac_keys.updated, EVENT-026), and identity
// association states (handle.changed, EVENT-058;
// identity.own_installation_added and _revoked).
//
// Hosted client records live in the KV bucket fabric-clients under
// <tenant>.<client_id>, with an index <tenant>.kp.<keypackage_ref> → client
// id for every KeyPackage handed out, and <tenant>.cred.<digest>.<client_id>
// for the clients sharing a credential handle. Everything else lives in
// fabric-stores under <tenant>.<client_id>.…, each key holding its state and
// the events its last changes still owe (package outbox), so an event is
// emitted exactly when its change is stored, once, in the order of the
// changes to that key.
package clientstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/internal/engine"
)

// DefaultHMACEpochPeriod is the HMAC epoch length unless configured:
// epoch = floor(unix_time / period).
const DefaultHMACEpochPeriod = 30 * 24 * time.Hour

// Config configures a Store.
type Config struct {
	// JS reaches the fabric-clients and fabric-stores buckets and the
	// FABRIC_EVENTS stream, all provisioned beforehand (package streams).
	JS jetstream.JetStream
	// Vault seals the installations' private parts at rest.
	Vault *engine.Vault
	// Verifier checks bearer tokens.
	Verifier *auth.Verifier
	// Clock is the source of time; the system clock when nil.
	Clock Clock
	// HMACEpochPeriod is the HMAC epoch length; DefaultHMACEpochPeriod when
	// zero.
	HMACEpochPeriod time.Duration
	// Logger receives diagnostics; slog.Default when nil.
	Logger *slog.Logger
	// Registerer receives the metrics; none are registered when nil.
	Registerer prometheus.Registerer
}

// Store serves the client stores over HTTP and owns the HMAC epoch timer.
// A registered client is open, in EVENT-026's sense, while Run runs.
type Store struct {
	vault   *engine.Vault
	verify  *auth.Verifier
	clock   Clock
	period  time.Duration
	log     *slog.Logger
	clients jetstream.KeyValue
	stores  jetstream.KeyValue
	out     *outbox.Outbox
	metrics *metrics
	js      jetstream.JetStream // lists read fabric-stores by sequence (list.go)

	// startEpoch is the HMAC epoch when the store opened (EVENT-026).
	startEpoch int64
}

// New opens the buckets; Run runs the HMAC epoch timer.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.JS == nil || cfg.Vault == nil || cfg.Verifier == nil {
		return nil, errors.New("clientstore: JS, Vault and Verifier are required")
	}
	if cfg.HMACEpochPeriod != 0 && (cfg.HMACEpochPeriod < time.Second || cfg.HMACEpochPeriod%time.Second != 0) {
		return nil, errors.New("clientstore: HMACEpochPeriod must be a whole number of seconds")
	}
	s := &Store{
		vault:   cfg.Vault,
		verify:  cfg.Verifier,
		clock:   cfg.Clock,
		period:  cfg.HMACEpochPeriod,
		log:     cfg.Logger,
		metrics: newMetrics(cfg.Registerer),
	}
	if s.clock == nil {
		s.clock = systemClock{}
	}
	if s.period <= 0 {
		s.period = DefaultHMACEpochPeriod
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	var err error
	s.js = cfg.JS
	if s.clients, err = cfg.JS.KeyValue(ctx, streams.BucketClients); err != nil {
		return nil, fmt.Errorf("clientstore: open %s: %w", streams.BucketClients, err)
	}
	if s.stores, err = cfg.JS.KeyValue(ctx, streams.BucketStores); err != nil {
		return nil, fmt.Errorf("clientstore: open %s: %w", streams.BucketStores, err)
	}
	groups, err := cfg.JS.KeyValue(ctx, streams.BucketGroups)
	if err != nil {
		return nil, fmt.Errorf("clientstore: open %s: %w", streams.BucketGroups, err)
	}
	s.out = outbox.New(cfg.JS, s.stores, s.metrics.counting(outbox.EventBus(cfg.JS, groups)))
	s.startEpoch = s.epoch(s.clock.Now())
	return s, nil
}

// Run runs the HMAC epoch timer until ctx ends (ops.Component). The
// clients the store hosts are open, in EVENT-026's sense, while it runs.
func (s *Store) Run(ctx context.Context) error {
	s.runEpochTimer(ctx)
	return nil
}

// Clients is the fabric-clients bucket the store writes.
func (s *Store) Clients() jetstream.KeyValue { return s.clients }

// Lookup loads one of the store's clients.
func (s *Store) Lookup(ctx context.Context, tenant, clientID string) (Record, error) {
	return Lookup(ctx, s.clients, tenant, clientID)
}

// ClientInbox returns the inbox of a hosted client (ErrUnknownClient when
// the tenant has no such client).
func (s *Store) ClientInbox(ctx context.Context, tenant, clientID string) (string, error) {
	rec, err := s.Lookup(ctx, tenant, clientID)
	if err != nil {
		return "", notFoundOr(err)
	}
	return rec.InboxID, nil
}

// Handler serves the store's endpoints (see Mount).
func (s *Store) Handler() http.Handler {
	mux := http.NewServeMux()
	s.Mount(mux)
	return mux
}

// Mount adds the store's endpoints to mux:
//
//	POST /v1/tenants/{tenant}/clients
//	GET  /v1/tenants/{tenant}/clients
//	GET  /v1/tenants/{tenant}/clients/{client_id}
//	POST /v1/tenants/{tenant}/clients/{client_id}/key-packages
//	GET  /v1/tenants/{tenant}/clients/{client_id}/key-packages
//	PUT  /v1/tenants/{tenant}/clients/{client_id}/consent
//	GET  /v1/tenants/{tenant}/clients/{client_id}/consent/{entity_kind}/{entity}
//	PUT  /v1/tenants/{tenant}/clients/{client_id}/hmac-keys
//	PUT  /v1/tenants/{tenant}/clients/{client_id}/identities/{inbox_id}
//	GET  /v1/tenants/{tenant}/clients/{client_id}/identities/{inbox_id}
//
// All need the admin scope for the tenant and, below a client, the client.
func (s *Store) Mount(mux *http.ServeMux) {
	const c = "/v1/tenants/{tenant}/clients"
	mux.HandleFunc("POST "+c, s.handle(s.register))
	mux.HandleFunc("GET "+c, s.handle(s.listClients))
	mux.HandleFunc("GET "+c+"/{client_id}", s.handle(s.getClient))
	mux.HandleFunc("POST "+c+"/{client_id}/key-packages", s.handle(s.keyPackages))
	mux.HandleFunc("GET "+c+"/{client_id}/key-packages", s.handle(s.listKeyPackages))
	mux.HandleFunc("PUT "+c+"/{client_id}/consent", s.handle(s.putConsent))
	mux.HandleFunc("GET "+c+"/{client_id}/consent/{entity_kind}/{entity}", s.handle(s.getConsent))
	mux.HandleFunc("PUT "+c+"/{client_id}/hmac-keys", s.handle(s.putHMACKey))
	mux.HandleFunc("PUT "+c+"/{client_id}/identities/{inbox_id}", s.handle(s.putIdentity))
	mux.HandleFunc("GET "+c+"/{client_id}/identities/{inbox_id}", s.handle(s.getIdentity))
}

// epoch is the HMAC epoch of t: floor(unix_time / period).
func (s *Store) epoch(t time.Time) int64 {
	return t.Unix() / int64(s.period/time.Second)
}
