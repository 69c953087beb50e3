package allinone

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/fabric-mls/fabric/internal/auth"
)

// Per-tenant keys on every surface (issue 20): acme's tokens are EdDSA
// under keys its JWKS URL serves, globex's ES256 under a configured key
// with an issuer and audience. Each surface refuses, with 401 and the
// reason, a token of globex signed with acme's key, an expired one, one
// not yet valid, one for another audience or issuer, and an HS256 token
// whose secret is globex's public key; acme's rotation is seen without a
// restart.
func TestTenantKeysOnEverySurface(t *testing.T) {
	t.Parallel()
	_, acme1, _ := ed25519.GenerateKey(rand.Reader)
	_, acme2, _ := ed25519.GenerateKey(rand.Reader)
	globex, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	var (
		mu     sync.Mutex
		served = map[string]ed25519.PrivateKey{"a1": acme1}
	)
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		var set struct {
			Keys []map[string]string `json:"keys"`
		}
		for kid, k := range served {
			set.Keys = append(set.Keys, map[string]string{"kty": "OKP", "crv": "Ed25519", "kid": kid,
				"x": base64.RawURLEncoding.EncodeToString(k.Public().(ed25519.PublicKey))})
		}
		_ = json.NewEncoder(w).Encode(set)
	}))
	defer jwks.Close()
	globexPub, err := auth.ParseJWK(ecJWK(t, globex, "g1"))
	if err != nil {
		t.Fatal(err)
	}
	f := startFabric(t, Options{
		// A TTL this short refetches on every token, so a key the issuer
		// drops is refused at once.
		JWKSTTL: time.Nanosecond, JWKSMinRefetch: time.Nanosecond,
		TenantKeys: map[string]auth.TenantKeys{
			"acme":   {JWKSURL: jwks.URL},
			"globex": {Issuer: "https://id.globex.example", Audience: "fabric", Keys: []auth.PublicKey{globexPub}},
		},
	})
	all := []auth.Scope{auth.ScopeAdmin, auth.ScopeIngest, auth.ScopeEvents, auth.ScopeSignals}
	claims := func(tenant string) auth.Claims {
		c := auth.Claims{Tenant: tenant, Scopes: all, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)}
		if tenant == "globex" {
			c.Issuer, c.Audience = "https://id.globex.example", []string{"fabric"}
		}
		return c
	}
	sign := func(key ed25519.PrivateKey, kid string, c auth.Claims) string {
		tok, err := auth.MintWithKey(key, kid, c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	signGlobex := func(c auth.Claims) string {
		tok, err := auth.MintWithKey(globex, "g1", c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	wantAccepted := func(what, tenant, tok string) {
		t.Helper()
		for surface, a := range everySurface(t, f, tenant, tok) {
			if a.status == http.StatusUnauthorized || a.status == http.StatusForbidden || a.status >= 500 {
				t.Errorf("%s: %s: %+v, want the token accepted", what, surface, a)
			}
		}
	}
	wantAccepted("acme EdDSA from its JWKS", "acme", sign(acme1, "a1", claims("acme")))
	wantAccepted("globex ES256", "globex", signGlobex(claims("globex")))

	forGlobex := claims("globex")
	want401OnEverySurface(t, f, "acme's key signing for globex", "globex", sign(acme1, "g1", forGlobex), "no EdDSA key")
	expired, early, otherAud, otherIss := claims("globex"), claims("globex"), claims("globex"), claims("globex")
	expired.ExpiresAt = time.Now().Add(-time.Second)
	early.NotBefore = time.Now().Add(time.Hour)
	otherAud.Audience = []string{"another-service"}
	otherIss.Issuer = "https://id.acme.example"
	want401OnEverySurface(t, f, "expired", "globex", signGlobex(expired), "expired")
	want401OnEverySurface(t, f, "not yet valid", "globex", signGlobex(early), "not valid yet")
	want401OnEverySurface(t, f, "wrong audience", "globex", signGlobex(otherAud), "audience")
	want401OnEverySurface(t, f, "wrong issuer", "globex", signGlobex(otherIss), "issuer")
	der, _ := x509.MarshalPKIXPublicKey(&globex.PublicKey)
	confused := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"tenant": "globex", "scopes": all, "clients": []string{"*"},
		"iss": "https://id.globex.example", "aud": "fabric", "exp": time.Now().Add(time.Hour).Unix()})
	confusedTok, _ := confused.SignedString(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	want401OnEverySurface(t, f, "HS256 with globex's public key as secret", "globex", confusedTok, "invalid token")

	// acme rotates: a2 is served, a1 withdrawn; no restart.
	mu.Lock()
	served = map[string]ed25519.PrivateKey{"a2": acme2}
	mu.Unlock()
	wantAccepted("acme's new key", "acme", sign(acme2, "a2", claims("acme")))
	want401OnEverySurface(t, f, "acme's withdrawn key", "acme", sign(acme1, "a1", claims("acme")), "kid")
}

// ecJWK is the public JWK of an ECDSA P-256 key.
func ecJWK(t *testing.T, k *ecdsa.PrivateKey, kid string) []byte {
	t.Helper()
	raw, err := k.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]string{"kty": "EC", "crv": "P-256", "kid": kid,
		"x": base64.RawURLEncoding.EncodeToString(raw[1:33]), "y": base64.RawURLEncoding.EncodeToString(raw[33:])})
	return b
}
