package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/config"
)

// token mints a bearer token the roles accept and prints it: the first
// admin token of a deployment, or any other (issue 28). It signs with what
// the roles verify with: the operator's HS256 secret (FABRIC_JWT_SECRET or
// -jwt-secret-file, as deploy/ gives it to the roles), a tenant's signing
// key whose public half is in the roles' -tenant-keys, or the secret an
// all-in-one generated in its data folder.
func token(_ context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		errs                                   config.Errs
		tenant, scopes, clients                string
		secretFile, keyFile, kid, iss, aud, dd string
		ttl                                    time.Duration
	)
	lifetimes := maps.Clone(auth.DefaultLifetimes)
	fs := flag.NewFlagSet("fabric token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config.String(fs, &tenant, "tenant", "", "the tenant the token names (required)")
	config.String(fs, &scopes, "scopes", string(auth.ScopeAdmin), "comma-separated scopes: "+strings.Join(scopeNames(), ", "))
	config.String(fs, &clients, "clients", auth.AllClients, `comma-separated client ids the token may act for, or "*" for every client`)
	config.Duration(fs, &errs, &ttl, "ttl", time.Hour, "how long the token is valid; at most the roles' -max-token-lifetime for its scopes")
	config.Var(fs, &errs, &lifetimes, "max-token-lifetime", "the roles' -max-token-lifetime, when they set one: scope=duration,…")
	config.String(fs, &secretFile, "jwt-secret-file", "", "file holding the roles' HS256 secret (else FABRIC_JWT_SECRET)")
	config.String(fs, &keyFile, "key-file", "", "PEM private key (Ed25519 or ECDSA P-256) of the tenant, whose public key the roles' -tenant-keys hold")
	config.String(fs, &kid, "kid", "", "with -key-file: the key's kid in -tenant-keys")
	config.String(fs, &iss, "issuer", "", "with -key-file: the issuer -tenant-keys names for the tenant")
	config.String(fs, &aud, "audience", "", "with -key-file: the audience -tenant-keys names for the tenant")
	config.String(fs, &dd, "data", "", "an all-in-one's data folder: sign with the secret it generated")
	if err := config.Parse(fs, args); err != nil {
		return err
	}

	c := auth.Claims{Tenant: tenant, Clients: splitList(clients)}
	if tenant == "" {
		errs.Addf("-tenant is required")
	}
	for _, s := range splitList(scopes) {
		if !slices.Contains(auth.Scopes(), auth.Scope(s)) {
			errs.Addf("-scopes: unknown scope %q; the scopes are %s", s, strings.Join(scopeNames(), ", "))
		}
		c.Scopes = append(c.Scopes, auth.Scope(s))
	}
	if len(c.Scopes) == 0 {
		errs.Addf("-scopes: name at least one scope")
	}
	if len(c.Clients) == 0 {
		errs.Addf(`-clients: name at least one client id, or "*"`)
	}
	if ttl <= 0 {
		errs.Addf("-ttl: %v; it must be positive", ttl)
	} else if scope, limit := lifetimes.Limit(c.Scopes); ttl > limit {
		errs.Addf("-ttl: %v is longer than the %v the roles accept for a token of scope %s (-max-token-lifetime)", ttl, limit, scope)
	}
	sources := 0
	for _, set := range []bool{keyFile != "", dd != "", secretFile != "" || os.Getenv("FABRIC_JWT_SECRET") != ""} {
		if set {
			sources++
		}
	}
	if sources > 1 {
		errs.Addf("sign with one of -key-file, -data, or -jwt-secret-file / FABRIC_JWT_SECRET")
	}
	if keyFile == "" && (kid != "" || iss != "" || aud != "") {
		errs.Addf("-kid, -issuer and -audience go with -key-file")
	}
	if err := errs.Err(); err != nil {
		return err
	}

	c.ExpiresAt = time.Now().Add(ttl)
	var (
		tok string
		err error
	)
	switch {
	case keyFile != "":
		pem, rerr := os.ReadFile(keyFile)
		if rerr != nil {
			return fmt.Errorf("-key-file: %w", rerr)
		}
		key, perr := auth.ParsePEMPrivateKey(pem)
		if perr != nil {
			return fmt.Errorf("-key-file %s: %w", keyFile, perr)
		}
		c.Issuer = iss
		if aud != "" {
			c.Audience = []string{aud}
		}
		tok, err = auth.MintWithKey(key, kid, c)
	case dd != "":
		secret, serr := allinone.JWTSecret(dd)
		if serr != nil {
			return fmt.Errorf("-data: %w", serr)
		}
		tok, err = auth.Mint(secret, c)
	default:
		secret := config.Secret(&errs, "FABRIC_JWT_SECRET", secretFile, auth.MinSecretLen)
		if err := errs.Err(); err != nil {
			return fmt.Errorf("%w (or sign with -key-file or -data)", err)
		}
		tok, err = auth.Mint(secret, c)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	fmt.Fprintf(stderr, "tenant %s, scopes %s, clients %s, valid until %s\n", tenant, strings.Join(splitList(scopes), ","), strings.Join(c.Clients, ","), c.ExpiresAt.UTC().Format(time.RFC3339))
	return nil
}

func scopeNames() []string {
	var out []string
	for _, s := range auth.Scopes() {
		out = append(out, string(s))
	}
	return out
}

// splitList splits a comma-separated flag value, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
