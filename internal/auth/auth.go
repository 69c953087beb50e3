// Package auth verifies the bearer tokens every role accepts (DESIGN §10).
//
// A token is a JWT signed with HS256 under the operator's secret, or with
// EdDSA or ES256 under a public key of the tenant it names: configured, or
// fetched from the tenant's JWKS URL and refetched as the issuer rotates.
// The tenant claim selects the keys, so one tenant's key never signs for
// another, and a tenant's issuer and audience are checked. Its claims name
// one tenant, the scopes the bearer holds, and the client ids it may act for
// ("*" for every client of the tenant). A request for another tenant, another
// client or another scope is refused, and the error says which.
package auth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/golang-jwt/jwt/v5"

	"github.com/fabric-mls/fabric/internal/bus/subject"
)

// Scope is one permission a token can carry.
type Scope string

// The scopes of DESIGN §10.
const (
	ScopeAdmin   Scope = "admin"   // client registration, consent, identity state
	ScopeIngest  Scope = "ingest"  // posting transport messages, reading outcomes
	ScopeEvents  Scope = "events"  // subscribing to client events
	ScopeSignals Scope = "signals" // reporting local changes
	ScopeRead    Scope = "read"    // reading a hosted client's state; admin implies it
	ScopeSend    Scope = "send"    // operations of hosted clients: send, create, invite, remove, rename, leave (admin implies it)
)

// Scopes returns every scope, in the order of the constants above.
func Scopes() []Scope {
	return []Scope{ScopeAdmin, ScopeIngest, ScopeEvents, ScopeSignals, ScopeRead, ScopeSend}
}

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
	// Minted says the fabric minted the token for a page (a connection
	// token, the claim "minted": true): it mints no other (issue 27).
	Minted bool
	// Issuer, Audience and NotBefore are minted into a token (iss, aud,
	// nbf); Verify checks them and does not return them.
	Issuer    string
	Audience  []string
	NotBefore time.Time
}

// The refusals of auth: a missing or invalid token, and a valid token
// that does not grant what was asked. Their messages say why.
var (
	ErrUnauthenticated = refusal.New(refusal.Unauthenticated, "unauthenticated", "invalid token")
	ErrForbidden       = refusal.New(refusal.Forbidden, "forbidden", "the token does not grant this")
)

func unauthenticated(format string, args ...any) *refusal.Error {
	return ErrUnauthenticated.With(format, args...)
}

func forbidden(format string, args ...any) *refusal.Error {
	return ErrForbidden.With(format, args...)
}

// Require reports whether the claims grant scope on the given tenant and, when
// clientID is not empty, on that client. It returns ErrForbidden saying what is
// missing otherwise.
func (c Claims) Require(scope Scope, tenant, clientID string) error {
	if c.Tenant != tenant {
		return forbidden("token is not valid for this tenant")
	}
	if !slices.Contains(c.Scopes, scope) && (scope != ScopeRead || !slices.Contains(c.Scopes, ScopeAdmin)) {
		return forbidden("token lacks scope %q", scope)
	}
	if clientID != "" && !c.AllowsClient(clientID) {
		return forbidden("token does not name this client")
	}
	return nil
}

// Delegate checks that c may hand a narrower token for tenant, limited to
// clients and scopes, to someone else (a backend minting a connection token
// for its page): c must grant each scope, or admin, on each client, no
// delegated token carries admin, and a minted token delegates nothing. It
// returns ErrForbidden saying what is missing otherwise.
func (c Claims) Delegate(tenant string, clients []string, scopes []Scope) error {
	if c.Minted {
		// Or a 5 s token would mint an hour's, which mints another
		// (issue 27): what the fabric minted delegates nothing.
		return forbidden("a minted token cannot mint tokens")
	}
	for _, s := range scopes {
		if s == ScopeAdmin {
			return forbidden("a delegated token cannot carry scope %q", ScopeAdmin)
		}
		for _, client := range clients {
			if c.Require(s, tenant, client) != nil && c.Require(ScopeAdmin, tenant, client) != nil {
				return forbidden("token grants neither %q nor %q for client %q", s, ScopeAdmin, client)
			}
		}
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
	Minted  bool     `json:"minted,omitempty"`
	jwt.RegisteredClaims
}

// Verifier checks tokens: HS256 under the operator's secret, and EdDSA or
// ES256 under the keys of the tenant the token names.
type Verifier struct {
	secret    []byte
	tenants   map[string]*tenantKeySet
	jwks      jwksPolicy
	now       func() time.Time
	lifetimes Lifetimes
}

// tenantKeySet is one tenant's configured keys and its JWKS cache.
type tenantKeySet struct {
	TenantKeys
	jwks *jwksCache // nil without a JWKS URL
}

// Option configures a Verifier.
type Option func(*Verifier)

// WithMaxLifetimes sets the longest a token may still be valid, per scope;
// scopes l leaves out keep DefaultLifetimes.
func WithMaxLifetimes(l Lifetimes) Option {
	return func(v *Verifier) { maps.Copy(v.lifetimes, l) }
}

// WithTenantKeys verifies EdDSA and ES256 tokens against the keys of the
// tenant each names (ParseTenantKeys reads them from a file). A tenant
// not in keys has no asymmetric key: its tokens verify only under the
// HS256 secret.
func WithTenantKeys(keys map[string]TenantKeys) Option {
	return func(v *Verifier) {
		v.tenants = make(map[string]*tenantKeySet, len(keys))
		for t, k := range keys {
			ks := &tenantKeySet{TenantKeys: k}
			if k.JWKSURL != "" {
				ks.jwks = &jwksCache{url: k.JWKSURL}
			}
			v.tenants[t] = ks
		}
	}
}

// WithJWKS sets how long fetched JWKS keys are used before they are
// fetched again (ttl) and the shortest time between two fetches of one
// tenant's set (minRefetch, which also bounds the refetch a token with an
// unknown kid causes); client does the fetches, http.DefaultClient when nil.
// Zero durations keep DefaultJWKSTTL and DefaultJWKSMinRefetch.
func WithJWKS(ttl, minRefetch time.Duration, client *http.Client) Option {
	return func(v *Verifier) {
		if ttl > 0 {
			v.jwks.ttl = ttl
		}
		if minRefetch > 0 {
			v.jwks.minRefetch = minRefetch
		}
		if client != nil {
			v.jwks.client = client
		}
	}
}

// WithClock sets the clock expiry, not-before and the JWKS cache are judged
// by; tests move it instead of sleeping.
func WithClock(now func() time.Time) Option {
	return func(v *Verifier) { v.now = now }
}

// NewVerifier returns a Verifier for the HS256 secret, which must be at
// least MinSecretLen bytes; it may be nil when WithTenantKeys is given, and
// then HS256 tokens are refused.
func NewVerifier(secret []byte, opts ...Option) (*Verifier, error) {
	v := &Verifier{
		secret:    slices.Clone(secret),
		jwks:      jwksPolicy{ttl: DefaultJWKSTTL, minRefetch: DefaultJWKSMinRefetch, client: http.DefaultClient},
		now:       time.Now,
		lifetimes: maps.Clone(DefaultLifetimes),
	}
	for _, o := range opts {
		o(v)
	}
	if (secret != nil || len(v.tenants) == 0) && len(secret) < MinSecretLen {
		return nil, fmt.Errorf("auth: secret has %d bytes, need at least %d", len(secret), MinSecretLen)
	}
	return v, nil
}

// errNoKey is a keyfunc failure whose reason the caller is told.
type errNoKey struct{ reason string }

func (e *errNoKey) Error() string { return e.reason }

// Verify checks token's signature, expiry and not-before, and for a token
// under a tenant's keys its issuer and audience, and returns its claims.
// The tenant claim selects the keys: a token for tenant B signed with
// tenant A's key finds no key that verifies it.
func (v *Verifier) Verify(ctx context.Context, token string) (Claims, error) {
	var (
		tc     tokenClaims
		signer *tenantKeySet // the tenant set that verified the token; nil for HS256
	)
	parser := jwt.NewParser(
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg(), AlgEdDSA, AlgES256}),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(v.now),
	)
	_, err := parser.ParseWithClaims(token, &tc, func(t *jwt.Token) (any, error) {
		alg := t.Method.Alg()
		if alg == jwt.SigningMethodHS256.Alg() {
			// Never a tenant's public key as an HMAC secret (alg confusion).
			if v.secret == nil {
				return nil, &errNoKey{"HS256 tokens are not accepted"}
			}
			return v.secret, nil
		}
		ks := v.tenants[tc.Tenant]
		if ks == nil {
			return nil, &errNoKey{"the token's tenant has no public keys"}
		}
		kid, _ := t.Header["kid"].(string)
		keys, err := v.tenantKeys(ctx, ks, alg, kid)
		if err != nil {
			return nil, err
		}
		signer = ks
		return keys, nil
	})
	var (
		ce *claimsError
		nk *errNoKey
	)
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return Claims{}, unauthenticated("token expired")
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return Claims{}, unauthenticated("token is not valid yet (nbf)")
	case errors.As(err, &ce):
		return Claims{}, unauthenticated("invalid token claims: %s", ce.reason)
	case errors.As(err, &nk):
		return Claims{}, unauthenticated("%s", nk.reason)
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
	if signer != nil {
		if signer.Issuer != "" && tc.Issuer != signer.Issuer {
			return Claims{}, unauthenticated("token issuer is not the tenant's issuer")
		}
		if signer.Audience != "" && !slices.Contains(tc.Audience, signer.Audience) {
			return Claims{}, unauthenticated("token audience does not name this fabric")
		}
	}
	if scope, limit := v.lifetimes.limit(tc.Scopes); tc.ExpiresAt.Sub(v.now()) > limit {
		return Claims{}, unauthenticated("token expires in more than %s, the longest allowed for scope %q", limit, scope)
	}
	return Claims{Tenant: tc.Tenant, Scopes: tc.Scopes, Clients: tc.Clients, ExpiresAt: tc.ExpiresAt.Time, Minted: tc.Minted}, nil
}

// tenantKeys returns the tenant's keys for alg and, when the token names
// one, kid: configured keys first, then its JWKS, fetched again once when
// kid is not among them (the issuer rotated).
func (v *Verifier) tenantKeys(ctx context.Context, ks *tenantKeySet, alg, kid string) (jwt.VerificationKeySet, error) {
	var set jwt.VerificationKeySet
	match := func(keys []PublicKey) {
		for _, k := range keys {
			if k.Alg == alg && (kid == "" || k.ID == kid) {
				set.Keys = append(set.Keys, k.Key)
			}
		}
	}
	match(ks.Keys)
	if len(set.Keys) == 0 && ks.jwks != nil {
		fetched, err := ks.jwks.get(ctx, &v.jwks, v.now(), false)
		match(fetched)
		if len(set.Keys) == 0 && kid != "" {
			fetched, err = ks.jwks.get(ctx, &v.jwks, v.now(), true)
			match(fetched)
		}
		if len(set.Keys) == 0 && err != nil {
			return set, &errNoKey{"the tenant's keys are unavailable"}
		}
	}
	if len(set.Keys) == 0 {
		return set, &errNoKey{fmt.Sprintf("no %s key of the token's tenant has this kid", alg)}
	}
	return set, nil
}

// FromRequest verifies the request's "Authorization: Bearer" token.
func (v *Verifier) FromRequest(r *http.Request) (Claims, error) {
	token, err := BearerToken(r)
	if err != nil {
		return Claims{}, err
	}
	return v.Verify(r.Context(), token)
}

// BearerToken returns the request's "Authorization: Bearer" token, or a
// ErrUnauthenticated when there is none.
func BearerToken(r *http.Request) (string, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return "", unauthenticated("missing bearer token")
	}
	return token, nil
}

// Mint signs claims with secret (HS256). The fabric uses it for
// development and connection tokens; tenants' tokens come from their
// issuers (MintWithKey).
func Mint(secret []byte, c Claims) (string, error) {
	if len(secret) < MinSecretLen {
		return "", fmt.Errorf("auth: secret has %d bytes, need at least %d", len(secret), MinSecretLen)
	}
	tc, err := c.token()
	if err != nil {
		return "", err
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, tc).SignedString(secret)
}

// MintWithKey signs claims as a tenant's issuer does: with an Ed25519
// private key (EdDSA) or an ECDSA P-256 one (ES256), naming kid in the
// header when it is not empty.
func MintWithKey(key crypto.Signer, kid string, c Claims) (string, error) {
	var method jwt.SigningMethod
	switch k := key.(type) {
	case ed25519.PrivateKey:
		method = jwt.SigningMethodEdDSA
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return "", errors.New("auth: ES256 needs a P-256 key")
		}
		method = jwt.SigningMethodES256
	default:
		return "", fmt.Errorf("auth: %T keys cannot sign; use Ed25519 or ECDSA P-256", key)
	}
	tc, err := c.token()
	if err != nil {
		return "", err
	}
	t := jwt.NewWithClaims(method, tc)
	if kid != "" {
		t.Header["kid"] = kid
	}
	return t.SignedString(key)
}

// token is the claim set of c.
func (c Claims) token() (tokenClaims, error) {
	if c.ExpiresAt.IsZero() {
		return tokenClaims{}, errors.New("auth: claims need an expiry")
	}
	tc := tokenClaims{
		Tenant:  c.Tenant,
		Scopes:  c.Scopes,
		Clients: c.Clients,
		Minted:  c.Minted,
		RegisteredClaims: jwt.RegisteredClaims{
			ExpiresAt: jwt.NewNumericDate(c.ExpiresAt),
			Issuer:    c.Issuer,
		},
	}
	if len(c.Audience) > 0 {
		tc.Audience = c.Audience
	}
	if !c.NotBefore.IsZero() {
		tc.NotBefore = jwt.NewNumericDate(c.NotBefore)
	}
	return tc, nil
}
