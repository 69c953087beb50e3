package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A tenant keys file is read and checked at start: with it the HS256
// secret may be left out (HS256 tokens are then refused); a bad file or
// a missing secret without one names the setting.
func TestAuthTenantKeysValidatedAtStart(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "keys.json")
	bad := filepath.Join(dir, "bad.json")
	_ = os.WriteFile(good, []byte(`{"tenants":{"acme":{"jwks_url":"https://id.acme.example/jwks","issuer":"https://id.acme.example","audience":"fabric"}}}`), 0o600)
	_ = os.WriteFile(bad, []byte(`{"tenants":{"acme":{"jwks_url":"http://id.acme.example/jwks"}}}`), 0o600)
	t.Setenv("FABRIC_JWT_SECRET", "")
	verifier := func(args ...string) (bool, []byte, error) {
		var (
			errs Errs
			a    Auth
		)
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		a.RegisterFlags(fs, &errs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		v, secret := a.Verifier(&errs)
		return v != nil, secret, errs.Err()
	}
	if ok, secret, err := verifier("-tenant-keys", good); !ok || secret != nil || err != nil {
		t.Fatalf("keys without a secret: verifier %t, secret %q, %v", ok, secret, err)
	}
	if _, _, err := verifier("-tenant-keys", bad); err == nil || !strings.Contains(err.Error(), "-tenant-keys") || !strings.Contains(err.Error(), "https") {
		t.Fatalf("http JWKS URL: %v", err)
	}
	if _, _, err := verifier("-tenant-keys", filepath.Join(dir, "missing.json")); err == nil || !strings.Contains(err.Error(), "-tenant-keys") {
		t.Fatalf("missing file: %v", err)
	}
	if _, _, err := verifier(); err == nil || !strings.Contains(err.Error(), "FABRIC_JWT_SECRET") {
		t.Fatalf("neither secret nor keys: %v", err)
	}
	if _, _, err := verifier("-tenant-keys", good, "-jwks-ttl", "0s"); err == nil || !strings.Contains(err.Error(), "-jwks-ttl") {
		t.Fatalf("zero TTL: %v", err)
	}
	t.Setenv("FABRIC_JWT_SECRET", strings.Repeat("s", 32))
	if ok, secret, err := verifier("-tenant-keys", good); !ok || len(secret) != 32 || err != nil {
		t.Fatalf("keys and a secret: %t %d %v", ok, len(secret), err)
	}
}

func TestParseOrigins(t *testing.T) {
	var errs Errs
	if got := ParseOrigins(&errs, " localhost:*, app.example.com ,"); len(got) != 2 || got[0] != "localhost:*" || got[1] != "app.example.com" || errs.Err() != nil {
		t.Fatalf("%q %v", got, errs.Err())
	}
	ParseOrigins(&errs, "https://app.example.com,[a")
	if err := errs.Err(); err == nil || strings.Count(err.Error(), "-allowed-origins") != 2 {
		t.Fatalf("bad patterns: %v", err)
	}
}
