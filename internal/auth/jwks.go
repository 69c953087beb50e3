package auth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Defaults of WithJWKS.
const (
	DefaultJWKSTTL        = 10 * time.Minute
	DefaultJWKSMinRefetch = 30 * time.Second
	jwksFetchTimeout      = 5 * time.Second
	maxJWKSBytes          = 1 << 20
)

// jwksPolicy is how every tenant's JWKS is cached.
type jwksPolicy struct {
	ttl        time.Duration // keys older than this are fetched again
	minRefetch time.Duration // fetches of one URL are at least this far apart
	client     *http.Client
}

// jwksCache holds one tenant's keys fetched from its JWKS URL. A fetch
// happens in the verification that needs it, so no goroutine runs when no
// token comes; it is serialised per tenant.
type jwksCache struct {
	url string

	mu      sync.Mutex
	keys    []PublicKey
	fetched time.Time // last fetch that succeeded
	tried   time.Time // last fetch attempt
	lastErr error
}

// get returns the tenant's fetched keys. It fetches them when none are
// held, when they are older than the TTL, or when refresh asks (a token
// names a kid the cache does not hold: the issuer rotated), but never
// sooner than minRefetch after the previous attempt, so tokens with made-up
// kids cannot make the fabric hammer the issuer. When a fetch fails the
// keys held are kept until one succeeds.
func (c *jwksCache) get(ctx context.Context, p *jwksPolicy, now time.Time, refresh bool) ([]PublicKey, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	due := c.keys == nil || now.Sub(c.fetched) >= p.ttl || refresh
	if due && (c.tried.IsZero() || now.Sub(c.tried) >= p.minRefetch) {
		c.tried = now
		keys, err := fetchJWKS(ctx, p.client, c.url)
		if err == nil {
			c.keys, c.fetched, c.lastErr = keys, now, nil
		} else {
			c.lastErr = err
		}
	}
	if c.keys == nil {
		return nil, c.lastErr
	}
	return c.keys, nil
}

// fetchJWKS reads a JWKS document.
func fetchJWKS(ctx context.Context, client *http.Client, url string) ([]PublicKey, error) {
	ctx, cancel := context.WithTimeout(ctx, jwksFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("fetch JWKS: %w", err)
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch JWKS: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch JWKS: %s answered %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("fetch JWKS: %w", err)
	}
	if len(body) > maxJWKSBytes {
		return nil, errors.New("fetch JWKS: document exceeds 1 MiB")
	}
	return parseJWKS(body)
}
