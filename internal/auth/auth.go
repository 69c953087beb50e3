// Package auth verifies the bearer tokens every role accepts (DESIGN §10).
//
// A token is a JWT signed with HS256 under a configured secret. Its claims name
// one tenant, the scopes the bearer holds, and the client ids it may act for
// ("*" for every client of the tenant). A request for another tenant, another
// client or another scope is refused, and the error says which.
package auth

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/fabric-mls/fabric/internal/subject"
)

// Scope is one permission a token can carry.
type Scope string

// The scopes of DESIGN §10.
const (
	ScopeAdmin   Scope = "admin"   // client registration, consent, identity state
	ScopeIngest  Scope = "ingest"  // posting transport messages, reading outcomes
	ScopeEvents  Scope = "events"  // subscribing to client events
	ScopeSignals Scope = "signals" // reporting local changes
)

// AllClients in a token's clients claim grants every client of the tenant.
const AllClients = "*"

// MinSecretLen is the shortest HS256 secret a Verifier accepts.
const MinSecretLen = 32

// Claims are what a verified token grants.
type Claims struct {
	Tenant    string   `json:"tenant"`
	Scopes    []Scope  `json:"scopes"`
	Clients   []string `json:"clients"`
	ExpiresAt time.Time
}

// Error is a refused request. Status is 401 for a missing or invalid token and
// 403 for a valid token that does not grant what was asked.
type Error struct {
	Status int
	Code   string // "unauthenticated" or "forbidden"
	Reason string
}

func (e *Error) Error() string { return "auth: " + e.Reason }

func unauthenticated(format string, args ...any) *Error {
	return &Error{Status: http.StatusUnauthorized, Code: "unauthenticated", Reason: fmt.Sprintf(format, args...)}
}

func forbidden(format string, args ...any) *Error {
	return &Error{Status: http.StatusForbidden, Code: "forbidden", Reason: fmt.Sprintf(format, args...)}
}

// Require reports whether the claims grant scope on the given tenant and, when
// clientID is not empty, on that client. It returns a 403 *Error saying what is
// missing otherwise.
func (c Claims) Require(scope Scope, tenant, clientID string) error {
	if c.Tenant != tenant {
		return forbidden("token is not valid for this tenant")
	}
	if !slices.Contains(c.Scopes, scope) {
		return forbidden("token lacks scope %q", scope)
	}
	if clientID != "" && !c.AllowsClient(clientID) {
		return forbidden("token does not name this client")
	}
	return nil
}

// AllowsClient reports whether the claims name clientID or every client.
func (c Claims) AllowsClient(clientID string) bool {
	return slices.Contains(c.Clients, AllClients) || slices.Contains(c.Clients, clientID)
}

type tokenClaims struct {
	Tenant  string   `json:"tenant"`
	Scopes  []Scope  `json:"scopes,omitempty"`
	Clients []string `json:"clients,omitempty"`
	jwt.RegisteredClaims
}

// Verifier checks tokens signed with one HS256 secret.
type Verifier struct {
	secret    []byte
	parser    *jwt.Parser
	lifetimes Lifetimes
}

// Option configures a Verifier.
type Option func(*Verifier)

// WithMaxLifetimes sets the longest a token may still be valid, per scope;
// scopes l leaves out keep DefaultLifetimes.
func WithMaxLifetimes(l Lifetimes) Option {
	return func(v *Verifier) { maps.Copy(v.lifetimes, l) }
}

// NewVerifier returns a Verifier for secret, which must be at least
// MinSecretLen bytes.
func NewVerifier(secret []byte, opts ...Option) (*Verifier, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("auth: secret has %d bytes, need at least %d", len(secret), MinSecretLen)
	}
	v := &Verifier{
		secret: slices.Clone(secret),
		parser: jwt.NewParser(
			jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
			jwt.WithExpirationRequired(),
		),
		lifetimes: maps.Clone(DefaultLifetimes),
	}
	for _, o := range opts {
		o(v)
	}
	return v, nil
}

// Verify checks token's signature and expiry and returns its claims.
func (v *Verifier) Verify(token string) (Claims, error) {
	var tc tokenClaims
	_, err := v.parser.ParseWithClaims(token, &tc, func(*jwt.Token) (any, error) { return v.secret, nil })
	var ce *claimsError
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return Claims{}, unauthenticated("token expired")
	case errors.As(err, &ce):
		return Claims{}, unauthenticated("invalid token claims: %s", ce.reason)
	case err != nil:
		return Claims{}, unauthenticated("invalid token")
	}
	if tc.Tenant == "" {
		return Claims{}, unauthenticated("token names no tenant")
	}
	// A tenant outside the subject alphabet could never be served; refusing
	// it here answers 401 on every surface instead of failing later.
	var bad *subject.InvalidTokenError
	if errors.As(subject.ValidTenant(tc.Tenant), &bad) {
		return Claims{}, unauthenticated("token names an invalid tenant: %s", bad.Reason)
	}
	if scope, limit := v.lifetimes.limit(tc.Scopes); time.Until(tc.ExpiresAt.Time) > limit {
		return Claims{}, unauthenticated("token expires in more than %s, the longest allowed for scope %q", limit, scope)
	}
	return Claims{Tenant: tc.Tenant, Scopes: tc.Scopes, Clients: tc.Clients, ExpiresAt: tc.ExpiresAt.Time}, nil
}

// FromRequest verifies the request's "Authorization: Bearer" token.
func (v *Verifier) FromRequest(r *http.Request) (Claims, error) {
	h := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || token == "" {
		return Claims{}, unauthenticated("missing bearer token")
	}
	return v.Verify(token)
}

// Mint signs claims with secret. The fabric uses it for development tokens;
// production tokens come from the operator's issuer.
func Mint(secret []byte, c Claims) (string, error) {
	if len(secret) < MinSecretLen {
		return "", fmt.Errorf("auth: secret has %d bytes, need at least %d", len(secret), MinSecretLen)
	}
	if c.ExpiresAt.IsZero() {
		return "", errors.New("auth: claims need an expiry")
	}
	tc := tokenClaims{
		Tenant:           c.Tenant,
		Scopes:           c.Scopes,
		Clients:          c.Clients,
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(c.ExpiresAt)},
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, tc).SignedString(secret)
}
