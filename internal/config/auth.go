package config

import (
	"flag"
	"maps"
	"os"
	"path"
	"strings"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
)

// Auth is how a role verifies bearer tokens: the HS256 secret, the
// per-tenant public keys and JWKS URLs, the JWKS cache and the longest
// token lifetimes.
type Auth struct {
	SecretFile     string
	Lifetimes      auth.Lifetimes
	TenantKeysFile string
	JWKSTTL        time.Duration
	JWKSMinRefetch time.Duration
}

// RegisterFlags registers -jwt-secret-file, -max-token-lifetime,
// -tenant-keys, -jwks-ttl and -jwks-min-refetch.
func (a *Auth) RegisterFlags(fs *flag.FlagSet, errs *Errs) {
	String(fs, &a.SecretFile, "jwt-secret-file", "", "file holding the HS256 token secret (else FABRIC_JWT_SECRET)")
	a.Lifetimes = maps.Clone(auth.DefaultLifetimes)
	Var(fs, errs, &a.Lifetimes, "max-token-lifetime", "longest a bearer token may still be valid, per scope: scope=duration,…")
	String(fs, &a.TenantKeysFile, "tenant-keys", "", "JSON file of each tenant's token keys (JWK or PEM, EdDSA or ES256), JWKS URL, issuer and audience")
	Duration(fs, errs, &a.JWKSTTL, "jwks-ttl", auth.DefaultJWKSTTL, "how long keys fetched from a tenant's JWKS URL are used before they are fetched again")
	Duration(fs, errs, &a.JWKSMinRefetch, "jwks-min-refetch", auth.DefaultJWKSMinRefetch, "shortest time between two fetches of one tenant's JWKS (a token with an unknown kid fetches it again)")
}

// TenantKeys reads the -tenant-keys file; nil when none is given.
func (a Auth) TenantKeys(errs *Errs) map[string]auth.TenantKeys {
	if a.JWKSTTL <= 0 || a.JWKSMinRefetch <= 0 {
		errs.Addf("-jwks-ttl and -jwks-min-refetch must be positive")
	}
	if a.TenantKeysFile == "" {
		return nil
	}
	b, err := os.ReadFile(a.TenantKeysFile)
	if err != nil {
		errs.Addf("-tenant-keys: %v", err)
		return nil
	}
	keys, err := auth.ParseTenantKeys(b)
	if err != nil {
		errs.Addf("-tenant-keys %s: %v", a.TenantKeysFile, err)
		return nil
	}
	return keys
}

// options are the verifier options for keys (from TenantKeys).
func (a Auth) options(keys map[string]auth.TenantKeys) []auth.Option {
	opts := []auth.Option{auth.WithMaxLifetimes(a.Lifetimes), auth.WithJWKS(a.JWKSTTL, a.JWKSMinRefetch, nil)}
	if keys != nil {
		opts = append(opts, auth.WithTenantKeys(keys))
	}
	return opts
}

// Verifier builds a standalone role's verifier and returns it with the
// HS256 secret. The secret is required unless tenant keys are given; then,
// when it is not set either, HS256 tokens are refused and secret is nil.
func (a Auth) Verifier(errs *Errs) (*auth.Verifier, []byte) {
	keys := a.TenantKeys(errs)
	var secret []byte
	if keys == nil || a.SecretFile != "" || os.Getenv("FABRIC_JWT_SECRET") != "" {
		secret = Secret(errs, "FABRIC_JWT_SECRET", a.SecretFile, auth.MinSecretLen)
	}
	if len(*errs) > 0 {
		return nil, nil
	}
	v, err := auth.NewVerifier(secret, a.options(keys)...)
	if err != nil {
		errs.Addf("%v", err)
		return nil, nil
	}
	return v, secret
}

// Origins registers -allowed-origins: the browser origins, as host
// patterns (path.Match: localhost:*, *.example.com), whose pages may open a
// WebSocket and call the read API (CORS) besides the server's own host.
func Origins(fs *flag.FlagSet, p *string) {
	String(fs, p, "allowed-origins", "", "browser origins allowed to open a WebSocket and call the read API besides the server's own host, as comma-separated host patterns (localhost:*,app.example.com)")
}

// ParseOrigins splits the -allowed-origins value and checks each pattern.
func ParseOrigins(errs *Errs, s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if _, err := path.Match(p, ""); err != nil || strings.Contains(p, "/") {
			errs.Addf("-allowed-origins: %q is not a host pattern like app.example.com or localhost:*", p)
			continue
		}
		out = append(out, p)
	}
	return out
}
