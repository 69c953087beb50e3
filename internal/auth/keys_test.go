package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/refusal"

	"github.com/golang-jwt/jwt/v5"
)

// issuerKey is a tenant issuer's signing key and its public JWK.
type issuerKey struct {
	kid  string
	priv crypto.Signer
}

func newEd25519(t *testing.T, kid string) issuerKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return issuerKey{kid, priv}
}

func newP256(t *testing.T, kid string) issuerKey {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return issuerKey{kid, priv}
}

// jwk is the public JWK of k.
func (k issuerKey) jwk() map[string]string {
	b64 := base64.RawURLEncoding.EncodeToString
	switch pub := k.priv.Public().(type) {
	case ed25519.PublicKey:
		return map[string]string{"kty": "OKP", "crv": "Ed25519", "x": b64(pub), "kid": k.kid, "alg": AlgEdDSA, "use": "sig"}
	case *ecdsa.PublicKey:
		raw, _ := pub.Bytes()
		return map[string]string{"kty": "EC", "crv": "P-256", "x": b64(raw[1:33]), "y": b64(raw[33:]), "kid": k.kid, "alg": AlgES256}
	}
	panic("unknown key")
}

// pem is the public key of k in PEM.
func (k issuerKey) pem(t *testing.T) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(k.priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func (k issuerKey) mint(t *testing.T, c Claims) string {
	t.Helper()
	tok, err := MintWithKey(k.priv, k.kid, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func events(tenant string, exp time.Time) Claims {
	return Claims{Tenant: tenant, Scopes: []Scope{ScopeEvents}, Clients: []string{AllClients}, ExpiresAt: exp}
}

// want401 checks err is a 401 whose reason contains reason.
func want401(t *testing.T, what string, err error, reason string) {
	t.Helper()
	var ae *refusal.Error
	if !errors.As(err, &ae) || !errors.Is(err, ErrUnauthenticated) || !strings.Contains(ae.Message, reason) {
		t.Errorf("%s: err = %v, want 401 saying %q", what, err, reason)
	}
}

// keysFileOf writes a tenant keys file.
func keysFileOf(t *testing.T, tenants map[string]any) map[string]TenantKeys {
	t.Helper()
	b, err := json.Marshal(map[string]any{"tenants": tenants})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := ParseTenantKeys(b)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// EdDSA and ES256 tokens verify under the keys of the tenant they name,
// given as JWK or PEM; a token naming tenant B signed with tenant A's key
// is refused, even when A's key id is one B also uses.
func TestTenantKeysEdDSAAndES256(t *testing.T) {
	acmeEd, acmeEC := newEd25519(t, "k1"), newP256(t, "k2")
	globexEd := newEd25519(t, "k1")
	keys := keysFileOf(t, map[string]any{
		"acme":   map[string]any{"keys": []any{acmeEd.jwk(), map[string]string{"kid": "k2", "pem": acmeEC.pem(t)}}},
		"globex": map[string]any{"keys": []any{globexEd.jwk()}},
	})
	v, err := NewVerifier(nil, WithTenantKeys(keys))
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour)
	for name, tok := range map[string]string{
		"acme EdDSA": acmeEd.mint(t, events("acme", exp)), "acme ES256": acmeEC.mint(t, events("acme", exp)),
		"globex EdDSA": globexEd.mint(t, events("globex", exp)),
		"no kid":       issuerKey{"", acmeEd.priv}.mint(t, events("acme", exp)),
	} {
		if c, err := v.Verify(t.Context(), tok); err != nil || c.Tenant != strings.Fields(name)[0] && name != "no kid" {
			t.Errorf("%s: %+v %v", name, c, err)
		}
	}
	want401(t, "acme's key signs for globex", ignore(v.Verify(t.Context(), acmeEd.mint(t, events("globex", exp)))), "")
	want401(t, "acme's ES256 key signs for globex", ignore(v.Verify(t.Context(), acmeEC.mint(t, events("globex", exp)))), "no ES256 key")
	want401(t, "tenant without keys", ignore(v.Verify(t.Context(), acmeEd.mint(t, events("initech", exp)))), "no public keys")
	want401(t, "HS256 without a secret", ignore(v.Verify(t.Context(), mint(t, events("acme", exp)))), "HS256 tokens are not accepted")
}

func ignore(_ Claims, err error) error { return err }

// iss, aud, nbf and exp are checked: a tenant's expected issuer and
// audience, and the times by the verifier's clock.
func TestTenantTokenClaimsChecked(t *testing.T) {
	k := newEd25519(t, "k1")
	v, err := NewVerifier(secret, WithTenantKeys(keysFileOf(t, map[string]any{
		"acme": map[string]any{"issuer": "https://id.acme.example", "audience": "fabric", "keys": []any{k.jwk()}},
	})))
	if err != nil {
		t.Fatal(err)
	}
	good := events("acme", time.Now().Add(time.Hour))
	good.Issuer, good.Audience = "https://id.acme.example", []string{"other", "fabric"}
	if _, err := v.Verify(t.Context(), k.mint(t, good)); err != nil {
		t.Fatalf("good token: %v", err)
	}
	wrongIss, wrongAud, noAud, early, expired := good, good, good, good, good
	wrongIss.Issuer = "https://id.globex.example"
	wrongAud.Audience = []string{"other"}
	noAud.Audience = nil
	early.NotBefore = time.Now().Add(time.Minute)
	expired.ExpiresAt = time.Now().Add(-time.Second)
	want401(t, "wrong issuer", ignore(v.Verify(t.Context(), k.mint(t, wrongIss))), "issuer")
	want401(t, "wrong audience", ignore(v.Verify(t.Context(), k.mint(t, wrongAud))), "audience")
	want401(t, "no audience", ignore(v.Verify(t.Context(), k.mint(t, noAud))), "audience")
	want401(t, "not yet valid", ignore(v.Verify(t.Context(), k.mint(t, early))), "not valid yet")
	want401(t, "expired", ignore(v.Verify(t.Context(), k.mint(t, expired))), "expired")
	want401(t, "not yet valid HS256", ignore(v.Verify(t.Context(), mint(t, early))), "not valid yet")
}

// An HS256 token whose HMAC key is the tenant's public key (as PEM, or its
// raw bytes) is refused: a public key is never used as a secret.
func TestAlgConfusionRefused(t *testing.T) {
	k := newEd25519(t, "k1")
	keys := keysFileOf(t, map[string]any{"acme": map[string]any{"keys": []any{k.jwk()}}})
	withSecret, _ := NewVerifier(secret, WithTenantKeys(keys))
	keysOnly, _ := NewVerifier(nil, WithTenantKeys(keys))
	exp := time.Now().Add(time.Hour)
	for name, hmacKey := range map[string][]byte{"PEM": []byte(k.pem(t)), "raw": k.priv.Public().(ed25519.PublicKey)} {
		tc, _ := events("acme", exp).token()
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, tc)
		tok.Header["kid"] = "k1"
		s, err := tok.SignedString(hmacKey)
		if err != nil {
			t.Fatal(err)
		}
		want401(t, name+" as HS256 secret", ignore(withSecret.Verify(t.Context(), s)), "invalid token")
		want401(t, name+" as HS256 secret, no secret", ignore(keysOnly.Verify(t.Context(), s)), "HS256 tokens are not accepted")
	}
}

// jwksServer serves a JWKS the test changes, counting fetches.
type jwksServer struct {
	*httptest.Server
	mu      sync.Mutex
	keys    []issuerKey
	fetches atomic.Int64
}

func newJWKSServer(t *testing.T, keys ...issuerKey) *jwksServer {
	s := &jwksServer{keys: keys}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.fetches.Add(1)
		s.mu.Lock()
		set := map[string][]map[string]string{"keys": {{"kty": "RSA", "n": "AQAB", "e": "AQAB", "kid": "rsa"}}}
		for _, k := range s.keys {
			set["keys"] = append(set["keys"], k.jwk())
		}
		s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) serve(keys ...issuerKey) {
	s.mu.Lock()
	s.keys = keys
	s.mu.Unlock()
}

// clock is a test clock the JWKS cache and expiry are judged by.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// The tenant's JWKS rotates without a restart: a token with a new kid
// makes the verifier fetch the set again (no sooner than the minimum
// refetch interval after the last fetch), and a key the set no longer
// holds is refused once the cached set is older than the TTL.
func TestJWKSRotation(t *testing.T) {
	k1, k2, k3 := newEd25519(t, "k1"), newP256(t, "k2"), newEd25519(t, "k3")
	srv := newJWKSServer(t, k1)
	clk := &clock{now: time.Now()}
	v, err := NewVerifier(nil, WithClock(clk.Now), WithJWKS(10*time.Minute, 30*time.Second, srv.Client()),
		WithTenantKeys(keysFileOf(t, map[string]any{"acme": map[string]any{"jwks_url": srv.URL}})))
	if err != nil {
		t.Fatal(err)
	}
	verify := func(k issuerKey) error {
		_, err := v.Verify(t.Context(), k.mint(t, events("acme", clk.Now().Add(time.Hour))))
		return err
	}
	if err := verify(k1); err != nil {
		t.Fatalf("k1: %v", err)
	}
	if err := verify(k1); err != nil || srv.fetches.Load() != 1 {
		t.Fatalf("k1 again: %v, %d fetches, want 1 (cached)", err, srv.fetches.Load())
	}
	// The issuer adds k2; within the minimum interval it is not fetched.
	srv.serve(k1, k2)
	want401(t, "k2 inside the minimum refetch interval", verify(k2), "kid")
	clk.Add(31 * time.Second)
	if err := verify(k2); err != nil {
		t.Fatalf("k2 after rotation: %v", err)
	}
	// Made-up kids do not make the verifier fetch more than once per interval.
	n := srv.fetches.Load()
	for range 20 {
		want401(t, "made-up kid", verify(newEd25519(t, "nope")), "kid")
	}
	if got := srv.fetches.Load() - n; got > 1 {
		t.Errorf("20 unknown kids caused %d fetches, want at most 1", got)
	}
	// The issuer drops k1 and adds k3: k1 stays valid until the TTL.
	srv.serve(k2, k3)
	clk.Add(31 * time.Second)
	if err := verify(k3); err != nil {
		t.Fatalf("k3: %v", err)
	}
	srv.serve(k2)
	clk.Add(time.Minute)
	if err := verify(k3); err != nil {
		t.Fatalf("k3 before the TTL: %v", err)
	}
	clk.Add(10 * time.Minute)
	want401(t, "k3 after it was removed and the TTL passed", verify(k3), "kid")
	want401(t, "k1 after it was removed", verify(k1), "kid")
	if err := verify(k2); err != nil {
		t.Fatalf("k2 still served: %v", err)
	}
}

// A JWKS that cannot be fetched refuses its tenant's tokens with a reason
// and leaves the other tenants alone; keys once fetched outlive an outage.
func TestJWKSOutage(t *testing.T) {
	k := newEd25519(t, "k1")
	srv := newJWKSServer(t, k)
	clk := &clock{now: time.Now()}
	v, _ := NewVerifier(secret, WithClock(clk.Now), WithJWKS(time.Minute, time.Second, srv.Client()),
		WithTenantKeys(keysFileOf(t, map[string]any{
			"acme": map[string]any{"jwks_url": srv.URL},
			"down": map[string]any{"jwks_url": "http://127.0.0.1:1/jwks"},
		})))
	want401(t, "unreachable JWKS", ignore(v.Verify(t.Context(), k.mint(t, events("down", clk.Now().Add(time.Hour))))), "unavailable")
	if _, err := v.Verify(t.Context(), k.mint(t, events("acme", clk.Now().Add(time.Hour)))); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	clk.Add(2 * time.Minute)
	if _, err := v.Verify(t.Context(), k.mint(t, events("acme", clk.Now().Add(time.Hour)))); err != nil {
		t.Fatalf("cached keys during an outage: %v", err)
	}
}

func TestParseTenantKeysRefuses(t *testing.T) {
	ed := newEd25519(t, "k")
	rsaPEM := "-----BEGIN PUBLIC KEY-----\nMFwwDQYJKoZIhvcNAQEBBQADSwAwSAJBAMkBNDzA4m2GcUr5m0Iu3gKfmi2nJDQ+\nYLQfyuMvgbS8uVdr+RVpDntS+z12Ro7JG7qQ1d9T8N42O6xHcBI1LzMCAwEAAQ==\n-----END PUBLIC KEY-----\n"
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	der384, _ := x509.MarshalPKIXPublicKey(&p384.PublicKey)
	private := ed.jwk()
	private["d"] = "AAAA"
	wrongAlg := ed.jwk()
	wrongAlg["alg"] = AlgES256
	for name, tenants := range map[string]any{
		"private JWK":    map[string]any{"acme": map[string]any{"keys": []any{private}}},
		"alg mismatch":   map[string]any{"acme": map[string]any{"keys": []any{wrongAlg}}},
		"RSA PEM":        map[string]any{"acme": map[string]any{"keys": []any{map[string]string{"pem": rsaPEM}}}},
		"P-384 PEM":      map[string]any{"acme": map[string]any{"keys": []any{map[string]string{"pem": string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der384}))}}}},
		"http JWKS":      map[string]any{"acme": map[string]any{"jwks_url": "http://id.acme.example/jwks"}},
		"no keys":        map[string]any{"acme": map[string]any{"issuer": "x"}},
		"invalid tenant": map[string]any{"a.b": map[string]any{"keys": []any{ed.jwk()}}},
		"unknown member": map[string]any{"acme": map[string]any{"keys": []any{ed.jwk()}, "jwks": "x"}},
		"no tenants":     map[string]any{},
	} {
		b, _ := json.Marshal(map[string]any{"tenants": tenants})
		if _, err := ParseTenantKeys(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzParseJWKS: any document fetched from a JWKS URL is keys or an error,
// never a panic, and every key it yields verifies one of the two algorithms.
func FuzzParseJWKS(f *testing.F) {
	f.Add(`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","kid":"a"}]}`)
	f.Add(`{"keys":[{"kty":"EC","crv":"P-256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}`)
	f.Add(`{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"},{"kty":"EC","crv":"P-256","x":"AA","y":"AA"}]}`)
	f.Fuzz(func(t *testing.T, doc string) {
		keys, err := parseJWKS([]byte(doc))
		if err == nil && len(keys) == 0 {
			t.Fatal("no error and no keys")
		}
		for _, k := range keys {
			if k.Alg != AlgEdDSA && k.Alg != AlgES256 {
				t.Fatalf("key with alg %q", k.Alg)
			}
		}
	})
}

// A tenant's signing key in PEM (PKCS #8 Ed25519 or P-256, SEC 1 P-256)
// signs tokens its public key verifies (`fabric token -key-file`, issue 28);
// a key of another curve is refused.
func TestParsePEMPrivateKeySigns(t *testing.T) {
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	pkcs8 := func(k any) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}
	sec1, err := x509.MarshalECPrivateKey(p256)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"pkcs8 ed25519": pkcs8(ed),
		"pkcs8 p256":    pkcs8(p256),
		"sec1 p256":     pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}),
	} {
		key, err := ParsePEMPrivateKey(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		pub, err := publicKey(key.Public())
		if err != nil {
			t.Fatal(err)
		}
		pub.ID = "k1"
		v, err := NewVerifier(nil, WithTenantKeys(map[string]TenantKeys{"acme": {Keys: []PublicKey{pub}}}))
		if err != nil {
			t.Fatal(err)
		}
		tok, err := MintWithKey(key, "k1", Claims{Tenant: "acme", Scopes: []Scope{ScopeAdmin}, Clients: []string{AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := v.Verify(t.Context(), tok); err != nil {
			t.Errorf("%s: the token is refused: %v", name, err)
		}
	}
	if _, err := ParsePEMPrivateKey(pkcs8(p384)); err == nil {
		t.Error("a P-384 key was accepted")
	}
	if _, err := ParsePEMPrivateKey([]byte("not pem")); err == nil {
		t.Error("no PEM block was accepted")
	}
}
