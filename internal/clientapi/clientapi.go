// Package clientapi builds the client API, in one place for every process
// that serves it (cmd/ingest and the all-in-one): the client stores,
// signals, the read API and operations, on one mux under
// /v1/tenants/{tenant}/clients.
package clientapi

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/operations"
	"github.com/fabric-mls/fabric/internal/ops"
	"github.com/fabric-mls/fabric/internal/read"
	"github.com/fabric-mls/fabric/internal/signals"
)

// Routes are the ServeMux patterns the API is mounted on.
var Routes = []string{"/v1/tenants/{tenant}/clients", "/v1/tenants/{tenant}/clients/"}

// Config configures the client API.
type Config struct {
	// JS reaches the fabric-clients, fabric-stores and fabric-groups
	// buckets, FABRIC_EVENTS, and FABRIC_IN (operations).
	JS jetstream.JetStream
	// Vault seals hosted clients' private keys.
	Vault    *engine.Vault
	Verifier *auth.Verifier
	// OriginPatterns are the browser origins besides the API's own host
	// whose pages may call the read API (-allowed-origins).
	OriginPatterns []string
	// Logger receives diagnostics; slog.Default when nil.
	Logger *slog.Logger
	// Registerer receives the metrics; none are registered when nil.
	Registerer prometheus.Registerer
	// Quotas bound each tenant's operations and reads (docs/limits.md);
	// zero fields take defaults.
	Quotas Quotas
}

// Quotas are the per-tenant quotas of the client API's operations and
// read API.
type Quotas struct {
	Operations operations.Quotas
	Read       read.Quotas
}

// API is the client API of one process.
type API struct {
	store *clientstore.Store
	ops   *operations.API
	mux   *http.ServeMux
}

// New opens the stores' buckets and builds the routes; Run runs what the
// stores do in the background.
func New(ctx context.Context, cfg Config) (*API, error) {
	store, err := clientstore.New(ctx, clientstore.Config{JS: cfg.JS, Vault: cfg.Vault, Verifier: cfg.Verifier, Logger: cfg.Logger, Registerer: cfg.Registerer})
	if err != nil {
		return nil, err
	}
	sig, err := signals.New(ctx, signals.Config{JS: cfg.JS, Verifier: cfg.Verifier, Logger: cfg.Logger, Registerer: cfg.Registerer})
	if err != nil {
		return nil, err
	}
	rd, err := read.New(ctx, read.Config{JS: cfg.JS, Vault: cfg.Vault, Verifier: cfg.Verifier, Stores: store, OriginPatterns: cfg.OriginPatterns, Logger: cfg.Logger, Registerer: cfg.Registerer, Quotas: cfg.Quotas.Read})
	if err != nil {
		return nil, err
	}
	a := &API{store: store, ops: operations.New(operations.Config{JS: cfg.JS, Verifier: cfg.Verifier, Clients: store, Quotas: cfg.Quotas.Operations, Registerer: cfg.Registerer}), mux: http.NewServeMux()}
	store.Mount(a.mux)
	sig.Mount(a.mux)
	rd.Mount(a.mux)
	a.ops.Mount(a.mux)
	return a, nil
}

// Mount serves the API on Routes of mux.
func (a *API) Mount(mux interface{ Handle(string, http.Handler) }) {
	for _, p := range Routes {
		mux.Handle(p, a.mux)
	}
}

// Run runs the client stores' HMAC epoch timer and answers operation
// requests on NATS (fabric.operate.>) until ctx ends (ops.Component).
func (a *API) Run(ctx context.Context) error { return ops.Run(ctx, a.store, a.ops) }
