package auth

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func mint(t *testing.T, c Claims) string {
	t.Helper()
	tok, err := Mint(secret, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestVerifyRoundTrip(t *testing.T) {
	v, err := NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	got, err := v.Verify(mint(t, Claims{Tenant: "acme", Scopes: []Scope{ScopeEvents}, Clients: []string{"ab"}, ExpiresAt: exp}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Tenant != "acme" || len(got.Scopes) != 1 || got.Scopes[0] != ScopeEvents || got.Clients[0] != "ab" || !got.ExpiresAt.Equal(exp) {
		t.Fatalf("claims = %+v", got)
	}
}

func TestVerifyRefuses(t *testing.T) {
	v, _ := NewVerifier(secret)
	expired := mint(t, Claims{Tenant: "acme", ExpiresAt: time.Now().Add(-time.Minute)})
	other, _ := Mint([]byte("another-secret-another-secret-xx"), Claims{Tenant: "acme", ExpiresAt: time.Now().Add(time.Hour)})
	none := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"tenant": "acme", "exp": time.Now().Add(time.Hour).Unix()})
	noneTok, _ := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	noExp := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"tenant": "acme"})
	noExpTok, _ := noExp.SignedString(secret)
	noTenant := mint(t, Claims{ExpiresAt: time.Now().Add(time.Hour)})

	for name, tok := range map[string]string{
		"expired": expired, "wrong secret": other, "alg none": noneTok,
		"no expiry": noExpTok, "no tenant": noTenant, "garbage": "a.b.c",
	} {
		_, err := v.Verify(tok)
		var ae *Error
		if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
			t.Errorf("%s: err = %v, want 401", name, err)
		}
	}
}

func TestRequire(t *testing.T) {
	c := Claims{Tenant: "acme", Scopes: []Scope{ScopeEvents}, Clients: []string{"c1"}}
	if err := c.Require(ScopeEvents, "acme", "c1"); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"other tenant": c.Require(ScopeEvents, "globex", "c1"),
		"other client": c.Require(ScopeEvents, "acme", "c2"),
		"other scope":  c.Require(ScopeAdmin, "acme", "c1"),
	} {
		var ae *Error
		if !errors.As(err, &ae) || ae.Status != http.StatusForbidden || ae.Reason == "" {
			t.Errorf("%s: err = %v, want 403 with a reason", name, err)
		}
	}
	all := Claims{Tenant: "acme", Scopes: []Scope{ScopeEvents}, Clients: []string{AllClients}}
	if err := all.Require(ScopeEvents, "acme", "anything"); err != nil {
		t.Fatalf("wildcard clients: %v", err)
	}
}

func TestFromRequest(t *testing.T) {
	v, _ := NewVerifier(secret)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if _, err := v.FromRequest(r); err == nil || !strings.Contains(err.Error(), "missing bearer") {
		t.Fatalf("no header: %v", err)
	}
	r.Header.Set("Authorization", "Bearer "+mint(t, Claims{Tenant: "acme", ExpiresAt: time.Now().Add(time.Hour)}))
	if c, err := v.FromRequest(r); err != nil || c.Tenant != "acme" {
		t.Fatalf("FromRequest = %+v, %v", c, err)
	}
}

func TestShortSecretRefused(t *testing.T) {
	if _, err := NewVerifier([]byte("short")); err == nil {
		t.Fatal("short secret accepted")
	}
}

// A tenant that is not a tenant id ([a-z0-9_-]{1,64}) can never be served:
// its token is refused as unauthenticated, with the reason, before any
// surface builds a subject from it.
func TestVerifyRefusesInvalidTenant(t *testing.T) {
	v, _ := NewVerifier(secret)
	for _, tenant := range []string{"*", ">", "bad.*", "*.x", "b*", "Acme", "a b", strings.Repeat("a", 65)} {
		_, err := v.Verify(mint(t, Claims{Tenant: tenant, Scopes: []Scope{ScopeEvents}, ExpiresAt: time.Now().Add(time.Hour)}))
		var ae *Error
		if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized || !strings.Contains(ae.Reason, "invalid tenant") {
			t.Errorf("tenant %q: err = %v, want 401 naming the invalid tenant", tenant, err)
		}
	}
}
