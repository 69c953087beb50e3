package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// Admin is what a tenant's backend does before an app subscribes: it
// registers hosted clients (docs/client-stores.md) and mints short-lived
// connection tokens for the pages that show them (docs/auth.md#browsers).
type Admin struct {
	base, tenant, token string
	http                *http.Client
}

// NewAdmin returns the admin API of tenant at baseURL (the fabric's HTTP
// API, e.g. http://127.0.0.1:8080). RegisterClient needs a token of scope
// admin; MintConnectionToken one that holds each scope it delegates (or
// admin) on each client. A nil httpClient is http.DefaultClient.
func NewAdmin(baseURL, tenant, token string, httpClient *http.Client) *Admin {
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	return &Admin{base: strings.TrimRight(baseURL, "/"), tenant: tenant, token: token, http: httpClient}
}

// Registration asks for a hosted client of an inbox.
type Registration struct {
	// InboxID is the lowercase hex of the 32-byte account id.
	InboxID string `json:"inbox_id"`
	// KeyPackages is how many KeyPackages to hand out: 1 when nil (0 with
	// Import), at most 100.
	KeyPackages *int `json:"key_packages,omitempty"`
	// CredentialHandle names the credential the client shares with other
	// clients for lockout (EVENT-055); the client's own id when empty.
	CredentialHandle string `json:"credential_handle,omitempty"`
	// Import hosts existing key material instead of a generated
	// installation.
	Import *ImportedInstallation `json:"import,omitempty"`
}

// ImportedInstallation is an existing installation's KeyPackage
// (MLSMessage, its credential the registration's inbox) and private keys,
// in the RFC 9420 test-vector forms.
type ImportedInstallation struct {
	KeyPackage           schema.Bytes `json:"key_package"`
	SignaturePrivateKey  schema.Bytes `json:"signature_private_key"`
	EncryptionPrivateKey schema.Bytes `json:"encryption_private_key"`
	InitPrivateKey       schema.Bytes `json:"init_private_key"`
}

// HostedClient is a registered client. Its id is the lowercase hex of its
// installation key; KeyPackages are the KeyPackage MLSMessages remote
// members invite it with.
type HostedClient struct {
	ClientID         string         `json:"client_id"`
	InboxID          string         `json:"inbox_id"`
	InstallationKey  schema.Bytes   `json:"installation_key"`
	CredentialHandle string         `json:"credential_handle"`
	CreatedAt        time.Time      `json:"created_at"`
	KeyPackages      []schema.Bytes `json:"key_packages,omitempty"`
}

// RegisterClient registers a hosted client; the fabric emits its
// identity.registered once the record is stored.
func (a *Admin) RegisterClient(ctx context.Context, r Registration) (HostedClient, error) {
	var c HostedClient
	err := doJSON(ctx, a.http, http.MethodPost, a.path("clients"), a.token, "", r, &c)
	return c, err
}

// ConnectionTokenRequest names what a connection token grants.
type ConnectionTokenRequest struct {
	// Clients are 1 to 64 client ids of the tenant.
	Clients []string
	// Scopes are delegated, never admin: events when empty.
	Scopes []string
	// TTL is how long the token is valid, in whole seconds: the gateway's
	// default (300 s) when zero, at most its -max-connection-token-ttl.
	TTL time.Duration
}

// ConnectionToken is a minted token and when it expires.
type ConnectionToken struct {
	Token   string
	Expires time.Time
}

// MintConnectionToken mints a short-lived token limited to some clients and
// scopes, for a page to connect with (its first frame, never a URL); a
// connection lives no longer than its token.
func (a *Admin) MintConnectionToken(ctx context.Context, r ConnectionTokenRequest) (ConnectionToken, error) {
	if r.TTL < 0 || r.TTL%time.Second != 0 {
		return ConnectionToken{}, fmt.Errorf("client: connection token TTL %v is not a whole number of seconds", r.TTL)
	}
	body := struct {
		Clients    []string `json:"clients"`
		Scopes     []string `json:"scopes,omitempty"`
		TTLSeconds int64    `json:"ttl_seconds,omitempty"`
	}{r.Clients, r.Scopes, int64(r.TTL / time.Second)}
	var out struct {
		Token         string `json:"token"`
		ExpiresUnixMS int64  `json:"expires_unix_ms"`
	}
	if err := doJSON(ctx, a.http, http.MethodPost, a.path("connection-tokens"), a.token, "", body, &out); err != nil {
		return ConnectionToken{}, err
	}
	return ConnectionToken{Token: out.Token, Expires: time.UnixMilli(out.ExpiresUnixMS)}, nil
}

func (a *Admin) path(parts ...string) string {
	p := a.base + "/v1/tenants/" + url.PathEscape(a.tenant)
	for _, s := range parts {
		p += "/" + url.PathEscape(s)
	}
	return p
}
