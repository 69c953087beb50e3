package auth

import (
	"encoding/base64"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/refusal"

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
	got, err := v.Verify(t.Context(), mint(t, Claims{Tenant: "acme", Scopes: []Scope{ScopeEvents}, Clients: []string{"ab"}, ExpiresAt: exp}))
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
		_, err := v.Verify(t.Context(), tok)
		var ae *refusal.Error
		if !errors.As(err, &ae) || !errors.Is(err, ErrUnauthenticated) {
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
		var ae *refusal.Error
		if !errors.As(err, &ae) || !errors.Is(err, ErrForbidden) || ae.Message == "" {
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
		_, err := v.Verify(t.Context(), mint(t, Claims{Tenant: tenant, Scopes: []Scope{ScopeEvents}, ExpiresAt: time.Now().Add(time.Hour)}))
		var ae *refusal.Error
		if !errors.As(err, &ae) || !errors.Is(err, ErrUnauthenticated) || !strings.Contains(ae.Message, "invalid tenant") {
			t.Errorf("tenant %q: err = %v, want 401 naming the invalid tenant", tenant, err)
		}
	}
}

// signRaw signs a claim set given as raw JSON, as an issuer with its own
// encoder could.
func signRaw(t *testing.T, payload string) string {
	t.Helper()
	head := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	body := base64.RawURLEncoding.EncodeToString([]byte(payload))
	sig, err := jwt.SigningMethodHS256.Sign(head+"."+body, secret)
	if err != nil {
		t.Fatal(err)
	}
	return head + "." + body + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// Claims are read strictly (issue 17 item 8): each claim the fabric reads
// has one type, and no member appears twice.
func TestVerifyRefusesLenientClaims(t *testing.T) {
	v, _ := NewVerifier(secret)
	exp := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	if _, err := v.Verify(t.Context(), signRaw(t, `{"tenant":"acme","scopes":["events"],"exp":`+exp+`,"iss":"x","custom":{"a":[1]}}`)); err != nil {
		t.Fatalf("a strict claim set is refused: %v", err)
	}
	for name, payload := range map[string]string{
		"string exp":         `{"tenant":"acme","scopes":["events"],"exp":"` + exp + `"}`,
		"duplicate tenant":   `{"tenant":"acme","tenant":"globex","scopes":["events"],"exp":` + exp + `}`,
		"escaped duplicate":  `{"tenant":"acme","ten\u0061nt":"globex","scopes":["events"],"exp":` + exp + `}`,
		"duplicate exp":      `{"tenant":"acme","scopes":["events"],"exp":` + exp + `,"exp":1}`,
		"number tenant":      `{"tenant":7,"scopes":["events"],"exp":` + exp + `}`,
		"null tenant":        `{"tenant":null,"scopes":["events"],"exp":` + exp + `}`,
		"string scopes":      `{"tenant":"acme","scopes":"events","exp":` + exp + `}`,
		"null scope":         `{"tenant":"acme","scopes":[null],"exp":` + exp + `}`,
		"number client":      `{"tenant":"acme","scopes":["events"],"clients":[1],"exp":` + exp + `}`,
		"string iat":         `{"tenant":"acme","scopes":["events"],"exp":` + exp + `,"iat":"1"}`,
		"huge exp":           `{"tenant":"acme","scopes":["events"],"exp":1e300}`,
		"array":              `[{"tenant":"acme","exp":` + exp + `}]`,
		"trailing":           `{"tenant":"acme","scopes":["events"],"exp":` + exp + `} {}`,
		"case-folded tenant": `{"Tenant":"acme","scopes":["events"],"exp":` + exp + `}`,
		"string minted":      `{"tenant":"acme","scopes":["events"],"exp":` + exp + `,"minted":"true"}`,
		"number minted":      `{"tenant":"acme","scopes":["events"],"exp":` + exp + `,"minted":1}`,
	} {
		_, err := v.Verify(t.Context(), signRaw(t, payload))
		var ae *refusal.Error
		if !errors.As(err, &ae) || !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: err = %v, want 401", name, err)
		}
	}
}

// A token may be valid for at most its scope's lifetime from now (issue 17
// item 8): a 100-year token is refused; the limit is configurable.
func TestVerifyRefusesTokensBeyondTheScopeLifetime(t *testing.T) {
	v, _ := NewVerifier(secret)
	century := time.Now().AddDate(100, 0, 0)
	for _, scopes := range [][]Scope{{ScopeEvents}, {ScopeAdmin}, {ScopeEvents, ScopeAdmin}, nil, {"unknown"}} {
		_, err := v.Verify(t.Context(), mint(t, Claims{Tenant: "acme", Scopes: scopes, ExpiresAt: century}))
		var ae *refusal.Error
		if !errors.As(err, &ae) || !errors.Is(err, ErrUnauthenticated) || !strings.Contains(ae.Message, "longest allowed") {
			t.Errorf("%v, 100 years: err = %v, want 401", scopes, err)
		}
	}
	tenDays := time.Now().Add(10 * 24 * time.Hour)
	if _, err := v.Verify(t.Context(), mint(t, Claims{Tenant: "acme", Scopes: []Scope{ScopeEvents}, ExpiresAt: tenDays})); err != nil {
		t.Fatalf("events token for 10 days (default 30): %v", err)
	}
	if _, err := v.Verify(t.Context(), mint(t, Claims{Tenant: "acme", Scopes: []Scope{ScopeEvents, ScopeAdmin}, ExpiresAt: tenDays})); err == nil {
		t.Fatal("an admin token for 10 days passed (default 7)")
	}
	short, _ := NewVerifier(secret, WithMaxLifetimes(Lifetimes{ScopeEvents: time.Hour}))
	if _, err := short.Verify(t.Context(), mint(t, Claims{Tenant: "acme", Scopes: []Scope{ScopeEvents}, ExpiresAt: time.Now().Add(2 * time.Hour)})); err == nil {
		t.Fatal("a 2-hour events token passed a 1-hour limit")
	}
	if _, err := short.Verify(t.Context(), mint(t, Claims{Tenant: "acme", Scopes: []Scope{ScopeIngest}, ExpiresAt: tenDays})); err != nil {
		t.Fatalf("ingest keeps its default: %v", err)
	}
}

func TestParseLifetimes(t *testing.T) {
	l, err := ParseLifetimes("admin=24h, events=168h")
	if err != nil || len(l) != 2 || l[ScopeAdmin] != 24*time.Hour || l[ScopeEvents] != 168*time.Hour {
		t.Fatalf("%v %v", l, err)
	}
	if back, err := ParseLifetimes(DefaultLifetimes.String()); err != nil || !maps.Equal(back, DefaultLifetimes) {
		t.Fatalf("defaults do not round-trip: %v %v", back, err)
	}
	for _, bad := range []string{"admin", "root=1h", "admin=0s", "admin=-1h", "admin=soon"} {
		if _, err := ParseLifetimes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// FuzzVerifyClaims: any claim set, signed, is a claim set or a 401, never a
// panic; what verifies has a tenant and an expiry within the limit.
func FuzzVerifyClaims(f *testing.F) {
	exp := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	f.Add(`{"tenant":"acme","scopes":["events"],"exp":` + exp + `}`)
	f.Add(`{"tenant":"acme","tenant":"b","exp":"` + exp + `"}`)
	f.Add(`{"tenant":"acme","aud":["a"],"nbf":1.5,"exp":` + exp + `}`)
	v, _ := NewVerifier(secret)
	f.Fuzz(func(t *testing.T, payload string) {
		c, err := v.Verify(t.Context(), signRaw(t, payload))
		var ae *refusal.Error
		if err != nil && !errors.As(err, &ae) {
			t.Fatalf("error %v is not a refusal", err)
		}
		if err == nil && (c.Tenant == "" || time.Until(c.ExpiresAt) > 30*24*time.Hour) {
			t.Fatalf("verified %+v", c)
		}
	})
}
