package auth

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"

	"github.com/fabric-mls/fabric/internal/bus/subject"
)

// The asymmetric algorithms a tenant's keys sign with.
const (
	AlgEdDSA = "EdDSA" // Ed25519 (RFC 8037)
	AlgES256 = "ES256" // ECDSA on P-256 with SHA-256 (RFC 7518 §3.4)
)

// PublicKey is one public key of a tenant: its key id (JWK kid), the
// algorithm it verifies and the key.
type PublicKey struct {
	ID  string
	Alg string
	Key crypto.PublicKey
}

// TenantKeys are the keys that sign a tenant's tokens and what those
// tokens must say of themselves. A token verified by one of them must
// carry iss Issuer and have Audience among its aud, when they are set.
type TenantKeys struct {
	Issuer   string
	Audience string
	// Keys are configured keys.
	Keys []PublicKey
	// JWKSURL serves the tenant's JSON Web Key Set; its keys are fetched,
	// cached and refetched (WithJWKS) beside Keys.
	JWKSURL string
}

// keysFile is the tenant keys file: {"tenants": {"acme": {...}}}.
type keysFile struct {
	Tenants map[string]struct {
		Issuer   string            `json:"issuer"`
		Audience string            `json:"audience"`
		Keys     []json.RawMessage `json:"keys"`
		JWKSURL  string            `json:"jwks_url"`
	} `json:"tenants"`
}

// ParseTenantKeys reads the tenant keys file. Each tenant has keys (JWKs,
// or {"kid": ..., "pem": "-----BEGIN PUBLIC KEY-----..."}), a jwks_url, or
// both, and optionally the issuer and audience its tokens must name. Every
// key must be an Ed25519 or P-256 public key; a private key, an RSA key or
// an unknown member is an error, so a mistake stops the role at start.
func ParseTenantKeys(data []byte) (map[string]TenantKeys, error) {
	var f keysFile
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(&f); err != nil {
		return nil, fmt.Errorf("tenant keys: %w", err)
	}
	if len(f.Tenants) == 0 {
		return nil, errors.New("tenant keys: no tenants")
	}
	out := make(map[string]TenantKeys, len(f.Tenants))
	for tenant, t := range f.Tenants {
		if err := subject.ValidTenant(tenant); err != nil {
			return nil, fmt.Errorf("tenant keys: %q: %w", tenant, err)
		}
		tk := TenantKeys{Issuer: t.Issuer, Audience: t.Audience, JWKSURL: t.JWKSURL}
		if len(t.Keys) == 0 && t.JWKSURL == "" {
			return nil, fmt.Errorf("tenant keys: %s: neither keys nor jwks_url", tenant)
		}
		if t.JWKSURL != "" {
			if err := validJWKSURL(t.JWKSURL); err != nil {
				return nil, fmt.Errorf("tenant keys: %s: %w", tenant, err)
			}
		}
		for i, raw := range t.Keys {
			k, err := parseKeyEntry(raw)
			if err != nil {
				return nil, fmt.Errorf("tenant keys: %s: key %d: %w", tenant, i, err)
			}
			tk.Keys = append(tk.Keys, k)
		}
		out[tenant] = tk
	}
	return out, nil
}

// validJWKSURL accepts https URLs, and http ones on a loopback address
// only (a local issuer, tests): keys fetched in the clear could be forged.
func validJWKSURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Errorf("jwks_url %q is not an absolute URL", raw)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if ip := net.ParseIP(u.Hostname()); (ip != nil && ip.IsLoopback()) || u.Hostname() == "localhost" {
			return nil
		}
	}
	return fmt.Errorf("jwks_url %q: want https (http only on a loopback address)", raw)
}

// parseKeyEntry reads one entry of a tenant's keys: a PEM entry or a JWK.
func parseKeyEntry(raw json.RawMessage) (PublicKey, error) {
	var p struct {
		Kid string `json:"kid"`
		PEM string `json:"pem"`
	}
	if json.Unmarshal(raw, &p) == nil && p.PEM != "" {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		if err := d.Decode(&p); err != nil {
			return PublicKey{}, fmt.Errorf("PEM entry: %w", err)
		}
		k, err := ParsePEMKey([]byte(p.PEM))
		k.ID = p.Kid
		return k, err
	}
	return ParseJWK(raw)
}

// ParsePEMKey reads a PKIX public key in PEM: Ed25519 or ECDSA P-256.
func ParsePEMKey(data []byte) (PublicKey, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PUBLIC KEY" {
		return PublicKey{}, errors.New("want a PEM block of type PUBLIC KEY")
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return PublicKey{}, fmt.Errorf("public key: %w", err)
	}
	return publicKey(pub)
}

// ParsePEMPrivateKey reads a signing key in PEM, as a tenant's issuer holds
// it for MintWithKey: PKCS #8 (PRIVATE KEY) Ed25519 or ECDSA P-256, or SEC 1
// (EC PRIVATE KEY) P-256.
func ParsePEMPrivateKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("a PEM block of type %s; want PRIVATE KEY or EC PRIVATE KEY", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("private key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%T keys cannot sign", key)
	}
	if _, err := publicKey(signer.Public()); err != nil {
		return nil, err
	}
	return signer, nil
}

func publicKey(pub crypto.PublicKey) (PublicKey, error) {
	switch k := pub.(type) {
	case ed25519.PublicKey:
		return PublicKey{Alg: AlgEdDSA, Key: k}, nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return PublicKey{}, fmt.Errorf("ECDSA key on %s; ES256 needs P-256", k.Curve.Params().Name)
		}
		return PublicKey{Alg: AlgES256, Key: k}, nil
	}
	return PublicKey{}, fmt.Errorf("%T keys are not accepted; use Ed25519 (EdDSA) or P-256 (ES256)", pub)
}

// jwk is the members of a JSON Web Key (RFC 7517) the fabric reads.
type jwk struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	D   string `json:"d"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
}

// ParseJWK reads one public JWK: kty OKP crv Ed25519, or kty EC crv P-256.
// A key with a private part (d), for another use than sig, or whose alg
// disagrees with its type is refused.
func ParseJWK(raw []byte) (PublicKey, error) {
	var k jwk
	if err := json.Unmarshal(raw, &k); err != nil {
		return PublicKey{}, fmt.Errorf("JWK: %w", err)
	}
	if k.D != "" {
		return PublicKey{}, errors.New("JWK holds a private key; give the public key only")
	}
	if k.Use != "" && k.Use != "sig" {
		return PublicKey{}, fmt.Errorf("JWK use %q; want sig", k.Use)
	}
	var out PublicKey
	switch {
	case k.Kty == "OKP" && k.Crv == "Ed25519":
		x, err := base64.RawURLEncoding.DecodeString(k.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			return PublicKey{}, errors.New("JWK: x is not a base64url Ed25519 public key")
		}
		out = PublicKey{Alg: AlgEdDSA, Key: ed25519.PublicKey(x)}
	case k.Kty == "EC" && k.Crv == "P-256":
		x, errX := base64.RawURLEncoding.DecodeString(k.X)
		y, errY := base64.RawURLEncoding.DecodeString(k.Y)
		if errX != nil || errY != nil || len(x) != 32 || len(y) != 32 {
			return PublicKey{}, errors.New("JWK: x and y are not base64url P-256 coordinates")
		}
		// The parser refuses a point that is not on the curve.
		pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), slices.Concat([]byte{4}, x, y))
		if err != nil {
			return PublicKey{}, errors.New("JWK: the point is not on P-256")
		}
		out = PublicKey{Alg: AlgES256, Key: pub}
	default:
		return PublicKey{}, fmt.Errorf("JWK kty %q crv %q is not accepted; use OKP Ed25519 or EC P-256", k.Kty, k.Crv)
	}
	if k.Alg != "" && k.Alg != out.Alg {
		return PublicKey{}, fmt.Errorf("JWK alg %q does not match its key (%s)", k.Alg, out.Alg)
	}
	out.ID = k.Kid
	return out, nil
}

// parseJWKS reads a JSON Web Key Set. Keys the fabric cannot use (RSA,
// encryption keys) are skipped, since an issuer's set may hold them for
// other relying parties; an empty result is an error.
func parseJWKS(data []byte) ([]PublicKey, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	var out []PublicKey
	for _, raw := range set.Keys {
		if k, err := ParseJWK(raw); err == nil {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("JWKS holds no Ed25519 or P-256 signing key")
	}
	return out, nil
}
