package fanout

import (
	"net/http"
	"slices"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
)

// Bounds of a connection token.
const (
	DefaultConnectionTokenTTL    = 5 * time.Minute
	DefaultMaxConnectionTokenTTL = time.Hour
	MaxConnectionTokenClients    = 64
	maxConnectionTokenBody       = 16 << 10
)

// ConnectionTokenRequest is the body of POST connection-tokens: the
// clients and scopes the token is limited to (events when none is named)
// and its lifetime in seconds (DefaultConnectionTokenTTL when 0).
type ConnectionTokenRequest struct {
	Clients    []string     `json:"clients" msgpack:"clients"`
	Scopes     []auth.Scope `json:"scopes,omitempty" msgpack:"scopes,omitempty"`
	TTLSeconds int64        `json:"ttl_seconds,omitempty" msgpack:"ttl_seconds,omitempty"`
}

// ConnectionTokenResponse is the minted token and when it expires.
type ConnectionTokenResponse struct {
	Token         string `json:"token" msgpack:"token"`
	ExpiresUnixMS int64  `json:"expires_unix_ms" msgpack:"expires_unix_ms"`
}

// serveConnectionToken serves POST /v1/tenants/{tenant}/connection-tokens:
// a backend holding a token of the tenant mints a short-lived one limited
// to some of its clients and scopes, for a browser page to connect with
// (the page never holds the backend's token). A connection lives no longer
// than its token, so the page asks for a new one to reconnect. The token
// says it was minted (auth.Claims.Minted), mints none itself, and expires
// no later than the caller's (issue 27).
func (g *Gateway) serveConnectionToken(w http.ResponseWriter, r *http.Request) {
	tenant := r.PathValue("tenant")
	claims, err := g.cfg.Verifier.FromRequest(r)
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	if claims.Tenant != tenant {
		httpapi.WriteError(w, r, auth.ErrForbidden.With("token is not valid for this tenant"))
		return
	}
	if g.cfg.TokenSecret == nil {
		httpapi.WriteError(w, r, ErrConnectionTokensOff)
		return
	}
	var req ConnectionTokenRequest
	if err := httpapi.Decode(r, maxConnectionTokenBody, &req); err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	ttl, err := g.checkConnectionTokenRequest(&req)
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	if err := claims.Delegate(tenant, req.Clients, req.Scopes); err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	// Never beyond the caller's own token (issue 27).
	exp := time.Now().Add(ttl).Truncate(time.Second)
	if claims.ExpiresAt.Before(exp) {
		exp = claims.ExpiresAt
	}
	tok, err := auth.Mint(g.cfg.TokenSecret, auth.Claims{Tenant: tenant, Scopes: req.Scopes, Clients: req.Clients, ExpiresAt: exp, Minted: true})
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	g.metrics.connectionTokens.Inc()
	httpapi.Write(w, r, http.StatusCreated, ConnectionTokenResponse{Token: tok, ExpiresUnixMS: exp.UnixMilli()})
}

// checkConnectionTokenRequest fills the defaults of req and returns its
// lifetime, or a 400 naming what is wrong.
func (g *Gateway) checkConnectionTokenRequest(req *ConnectionTokenRequest) (time.Duration, error) {
	if len(req.Clients) == 0 || len(req.Clients) > MaxConnectionTokenClients {
		return 0, refusal.BadRequest("clients: name 1 to %d client ids", MaxConnectionTokenClients)
	}
	for _, c := range req.Clients {
		if err := subject.ValidClient(c); err != nil {
			return 0, refusal.BadRequest("clients: %v", err)
		}
	}
	if len(req.Scopes) == 0 {
		req.Scopes = []auth.Scope{auth.ScopeEvents}
	}
	for i, s := range req.Scopes {
		if _, known := auth.DefaultLifetimes[s]; !known || slices.Contains(req.Scopes[i+1:], s) {
			return 0, refusal.BadRequest("scopes: %q is unknown or named twice", s)
		}
	}
	if req.TTLSeconds == 0 {
		return min(DefaultConnectionTokenTTL, g.cfg.MaxConnectionTokenTTL), nil
	}
	limit := int64(g.cfg.MaxConnectionTokenTTL / time.Second)
	if req.TTLSeconds < 0 || req.TTLSeconds > limit {
		return 0, refusal.BadRequest("ttl_seconds: between 1 and %d", limit)
	}
	return time.Duration(req.TTLSeconds) * time.Second, nil
}
