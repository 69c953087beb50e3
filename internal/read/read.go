// Package read is the read API (docs/read-api.md): what a hosted client
// holds — its conversations, their members and messages, its consent and
// identity records — read over HTTP, so an app that reads again on an
// event sees the change (EVENT-010).
//
// It keeps no state: every answer is read from JetStream, the records
// converge stores in the same atomic batch as the events that report them
// (internal/readmodel) and the client stores' records, so every instance
// answers the same. Single records are read from the stream leader; pages
// cost what they return, not what the client holds.
package read

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
)

// Page bounds.
const (
	// DefaultLimit is a page's size when the request names none.
	DefaultLimit = 50
	// MaxLimit is the largest page.
	MaxLimit = 500
	// scanFactor bounds how many records a filtered page reads: scanFactor
	// times its limit; a page that reads that many ends early, with a
	// cursor to go on from.
	scanFactor = 8
)

// Config configures an API.
type Config struct {
	JS jetstream.JetStream
	// Vault derives the tenant keys message content is sealed under.
	Vault readmodel.Deriver
	// Verifier checks bearer tokens: scope read (or admin).
	Verifier *auth.Verifier
	// Stores holds the hosted clients, their consent and identity records.
	Stores *clientstore.Store
	Logger *slog.Logger
	// OriginPatterns are the browser origins besides the API's own host
	// whose pages may read (CORS), as -allowed-origins gives the gateway.
	OriginPatterns []string
	// Registerer registers the fabric_read_… metrics; nil registers none.
	Registerer prometheus.Registerer
	// Quotas bound each tenant's reads and a page's bytes; zero fields
	// take defaults.
	Quotas Quotas
}

// API serves the read routes.
type API struct {
	cfg     Config
	clients jetstream.KeyValue
	metrics *metrics
	limits  *limits
}

// New returns an API.
func New(ctx context.Context, cfg Config) (*API, error) {
	if cfg.JS == nil || cfg.Vault == nil || cfg.Verifier == nil || cfg.Stores == nil {
		return nil, errors.New("read: JS, Vault, Verifier and Stores are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	kv, err := cfg.JS.KeyValue(ctx, streams.BucketClients)
	if err != nil {
		return nil, err
	}
	m := newMetrics(cfg.Registerer)
	return &API{cfg: cfg, clients: kv, metrics: m, limits: newLimits(cfg.Quotas, m)}, nil
}

// Mount adds the routes to mux, each with its CORS preflight, so a page of
// an allowed origin reads as it subscribes.
func (a *API) Mount(mux *http.ServeMux) {
	const c = "/v1/tenants/{tenant}/clients/{client_id}"
	for _, r := range []struct {
		pattern, route string
		ep             endpoint
	}{
		{"GET " + c + "/conversations", "conversations", a.listConversations},
		{"GET " + c + "/conversations/{group_id}", "conversation", a.getConversation},
		{"GET " + c + "/conversations/{group_id}/members", "members", a.getMembers},
		{"GET " + c + "/conversations/{group_id}/messages", "messages", a.listMessages},
		{"GET " + c + "/messages/{message_id}", "message", a.getMessage},
		{"GET " + c + "/consent", "consent", a.listConsent},
		{"GET " + c + "/identities", "identities", a.listIdentities},
	} {
		h := httpapi.CORS(a.cfg.OriginPatterns, a.handle(r.route, r.ep))
		mux.Handle(r.pattern, h)
		mux.Handle(http.MethodOptions+strings.TrimPrefix(r.pattern, http.MethodGet), h)
	}
}

// Handler returns a mux with the routes.
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	a.Mount(mux)
	return mux
}

// call is one authorized request about one hosted client.
type call struct {
	tenant, client string
	// hold counts n bytes of records read in flight for the tenant until
	// the answer is written; false when they would pass its bound.
	hold func(n int) bool
}

type endpoint func(r *http.Request, c call) (any, error)

func (a *API) handle(route string, ep endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		held := 0 // bytes of records this request holds in flight
		tenant, body, err := a.serve(r, ep, &held)
		code := "ok"
		cw := &countingWriter{ResponseWriter: w}
		if err != nil {
			code = refusal.Code(err)
			httpapi.WriteError(cw, r, err)
		} else {
			httpapi.Write(cw, r, http.StatusOK, body)
		}
		if tenant != "" {
			a.limits.release(tenant, held)
			a.limits.charge(tenant, cw.n, time.Now())
		}
		a.metrics.requests.WithLabelValues(route, code).Inc()
		a.metrics.seconds.WithLabelValues(route).Observe(time.Since(start).Seconds())
	}
}

// serve answers an authorized request within its tenant's quotas; tenant
// is set once the request was admitted, so its answer is charged.
func (a *API) serve(r *http.Request, ep endpoint, held *int) (tenant string, _ any, _ error) {
	t, err := clientstore.Authorize(r, a.cfg.Verifier, auth.ScopeRead)
	if err != nil {
		return "", nil, err
	}
	if err := a.limits.admit(t.Tenant, time.Now()); err != nil {
		return "", nil, err
	}
	v, err := a.answer(r, ep, t.Tenant, t.ClientID, held)
	return t.Tenant, v, err
}

func (a *API) answer(r *http.Request, ep endpoint, tenant, client string, held *int) (any, error) {
	if _, err := a.cfg.Stores.Lookup(r.Context(), tenant, client); err != nil {
		if errors.Is(err, clientstore.ErrNotFound) {
			return nil, clientstore.ErrUnknownClient
		}
		return nil, err
	}
	c := call{tenant: tenant, client: client, hold: func(n int) bool {
		if !a.limits.hold(tenant, n) {
			return false
		}
		*held += n
		return true
	}}
	return ep(r, c)
}

// page is a request's limit and cursor.
type page struct {
	limit  int
	cursor uint64 // 0: from the start
}

// pageOf reads limit and cursor (httpapi.PageOf).
func pageOf(r *http.Request) (page, error) {
	p, err := httpapi.PageOf(r, DefaultLimit, MaxLimit)
	return page{limit: p.Limit, cursor: p.Cursor}, err
}

func cursorString(n uint64) string { return httpapi.Cursor(n) }

// The refusals of the read API besides an unknown client
// (clientstore.ErrUnknownClient) and a malformed request.
var (
	ErrConversationNotFound = refusal.New(refusal.NotFound, "conversation_not_found", "the client holds no such conversation")
	ErrMessageNotFound      = refusal.New(refusal.NotFound, "message_not_found", "the client holds no such message")
)
