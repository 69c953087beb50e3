package fanout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// mintToken mints a token with scopes for tenant naming clients.
func mintToken(t *testing.T, tenant string, scopes []auth.Scope, clients ...string) string {
	t.Helper()
	tok, err := auth.Mint(secret, auth.Claims{Tenant: tenant, Scopes: scopes, Clients: clients, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// postConnectionToken asks the gateway for a connection token with the
// caller's token and returns the status, the answer and the error code.
func postConnectionToken(t *testing.T, e *env, tenant, caller, body string) (int, ConnectionTokenResponse, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(e.ctx, http.MethodPost, e.srv.URL+"/v1/tenants/"+tenant+"/connection-tokens", strings.NewReader(body))
	if caller != "" {
		req.Header.Set("Authorization", "Bearer "+caller)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	var ok ConnectionTokenResponse
	var fail struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal(b.Bytes(), &ok)
	_ = json.Unmarshal(b.Bytes(), &fail)
	return resp.StatusCode, ok, fail.Error.Code
}

// A backend mints a short-lived connection token limited to one client and
// the events scope: the page connects with it and subscribes to that
// client only; the token expires when asked. A caller cannot delegate what
// it does not hold, nor admin, nor for another tenant.
func TestConnectionTokenMintedForAPage(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TokenSecret = secret; c.MaxConnectionTokenTTL = 10 * time.Minute })
	admin := mintToken(t, tenantA, []auth.Scope{auth.ScopeAdmin}, auth.AllClients)
	before := time.Now()
	status, got, code := postConnectionToken(t, e, tenantA, admin, `{"clients":["`+client1+`"],"ttl_seconds":60}`)
	if status != http.StatusCreated || got.Token == "" {
		t.Fatalf("mint: %d %s", status, code)
	}
	if exp := time.UnixMilli(got.ExpiresUnixMS); exp.Before(before.Add(59*time.Second)) || exp.After(time.Now().Add(60*time.Second)) {
		t.Fatalf("expires %v, want 60 s from now", exp)
	}
	claims, err := e.g.cfg.Verifier.Verify(e.ctx, got.Token)
	if err != nil || claims.Tenant != tenantA || len(claims.Scopes) != 1 || claims.Scopes[0] != auth.ScopeEvents || len(claims.Clients) != 1 || claims.Clients[0] != client1 {
		t.Fatalf("minted claims %+v, %v", claims, err)
	}
	c, err := client.Connect(e.ctx, e.wsURL(), got.Token, client.WithErrorHandler(func(error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Subscribe(e.ctx, client1, schema.EventFilter{Kinds: schema.AllKinds()})
	if err != nil {
		t.Fatalf("subscribe its client: %v", err)
	}
	e.publish(tenantA, client1, published{ev: hmacUpdated()})
	next(t, s)
	var ge *client.GatewayError
	if _, err := c.Subscribe(e.ctx, client2, schema.EventFilter{Kinds: schema.AllKinds()}); !errors.As(err, &ge) || ge.Code != "forbidden" {
		t.Fatalf("subscribe another client: %v, want forbidden", err)
	}

	events1 := mintToken(t, tenantA, []auth.Scope{auth.ScopeEvents}, client1)
	if status, _, _ := postConnectionToken(t, e, tenantA, events1, `{"clients":["`+client1+`"]}`); status != http.StatusCreated {
		t.Fatalf("an events token for c1 delegating c1: %d", status)
	}
	for name, tc := range map[string]struct {
		tenant, caller, body string
		status               int
		code                 string
	}{
		"no token":           {tenantA, "", `{"clients":["c1c1"]}`, 401, "unauthenticated"},
		"another tenant":     {tenantB, admin, `{"clients":["c1c1"]}`, 403, "forbidden"},
		"admin scope":        {tenantA, admin, `{"clients":["c1c1"],"scopes":["admin"]}`, 403, "forbidden"},
		"client not held":    {tenantA, events1, `{"clients":["c2c2"]}`, 403, "forbidden"},
		"scope not held":     {tenantA, events1, `{"clients":["c1c1"],"scopes":["signals"]}`, 403, "forbidden"},
		"every client":       {tenantA, admin, `{"clients":["*"]}`, 400, "bad_request"},
		"no client":          {tenantA, admin, `{"clients":[]}`, 400, "bad_request"},
		"unknown scope":      {tenantA, admin, `{"clients":["c1c1"],"scopes":["root"]}`, 400, "bad_request"},
		"beyond the longest": {tenantA, admin, `{"clients":["c1c1"],"ttl_seconds":601}`, 400, "bad_request"},
		"huge ttl":           {tenantA, admin, `{"clients":["c1c1"],"ttl_seconds":9223372036854775807}`, 400, "bad_request"},
		"negative ttl":       {tenantA, admin, `{"clients":["c1c1"],"ttl_seconds":-1}`, 400, "bad_request"},
		"unknown member":     {tenantA, admin, `{"clients":["c1c1"],"ttl":60}`, 400, "bad_request"},
	} {
		if status, _, code := postConnectionToken(t, e, tc.tenant, tc.caller, tc.body); status != tc.status || code != tc.code {
			t.Errorf("%s: %d %s, want %d %s", name, status, code, tc.status, tc.code)
		}
	}
}

// Without a signing secret the gateway says connection tokens are off.
func TestConnectionTokensOffWithoutSecret(t *testing.T) {
	e := newEnv(t)
	admin := mintToken(t, tenantA, []auth.Scope{auth.ScopeAdmin}, auth.AllClients)
	if status, _, code := postConnectionToken(t, e, tenantA, admin, `{"clients":["c1c1"]}`); status != http.StatusNotImplemented || code != "connection_tokens_off" {
		t.Fatalf("%d %s, want 501 connection_tokens_off", status, code)
	}
}

// SSE's access_token query parameter is off unless the gateway allows it:
// a token in a URL lands in access logs (issue 20).
func TestSSEQueryTokenOffByDefault(t *testing.T) {
	e := newEnv(t)
	path := "/v1/tenants/" + tenantA + "/clients/" + client1 + "/events?access_token=" + token(t, tenantA, client1)
	req, _ := http.NewRequestWithContext(e.ctx, http.MethodGet, e.srv.URL+path, nil)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body.Error.Message, "access_token in the URL is off") {
		t.Fatalf("%d %+v, want 401 saying the query token is off", resp.StatusCode, body.Error)
	}
}

// dialBare opens a WebSocket without an Authorization header, as a browser
// does.
func (e *env) dialBare(proto string) *rawConn {
	e.t.Helper()
	ws, _, err := websocket.Dial(e.ctx, e.wsURL(), &websocket.DialOptions{Subprotocols: []string{proto}})
	if err != nil {
		e.t.Fatal(err)
	}
	ws.SetReadLimit(1 << 20)
	e.t.Cleanup(func() { _ = ws.CloseNow() })
	return &rawConn{t: e.t, ws: ws}
}

// closed reads until the gateway closes the connection and returns its
// close code and reason.
func (r *rawConn) closed() (int, string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, b, err := r.ws.Read(ctx)
		var ce websocket.CloseError
		if errors.As(err, &ce) {
			return int(ce.Code), ce.Reason
		}
		if err != nil {
			r.t.Fatalf("read: %v, want a close frame", err)
		}
		r.t.Logf("frame before the close: %s", b)
	}
}

// A browser's WebSocket carries no Authorization header: its first frame,
// connect {token}, authenticates it (issue 20), in JSON and in msgpack
// through the SDK, with a backend's token or a minted connection token.
func TestConnectFrameAuthenticatesABrowserConnection(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TokenSecret = secret })
	r := e.dialBare(wire.SubprotocolJSON)
	r.send(wire.Frame{Op: wire.OpConnect, Token: token(t, tenantA, client1)})
	if got := r.read(); got.Op != wire.OpConnected {
		t.Fatalf("want connected, got %+v", got)
	}
	sub := r.subscribe(1, client1, schema.EventFilter{Kinds: schema.AllKinds()})
	e.publish(tenantA, client1, published{ev: hmacUpdated()})
	if got := r.read(); got.Op != wire.OpEvent || got.Sub != sub {
		t.Fatalf("want the event, got %+v", got)
	}
	r.send(wire.Frame{Op: wire.OpConnect, Token: token(t, tenantA, client1)})
	if got := r.read(); got.Op != wire.OpError || got.Code != wire.CodeMalformedFrame {
		t.Fatalf("a second connect: %+v, want malformed_frame", got)
	}

	admin := mintToken(t, tenantA, []auth.Scope{auth.ScopeAdmin}, auth.AllClients)
	status, minted, _ := postConnectionToken(t, e, tenantA, admin, `{"clients":["`+client2+`"],"ttl_seconds":120}`)
	if status != http.StatusCreated {
		t.Fatalf("mint: %d", status)
	}
	c, err := client.Connect(e.ctx, e.wsURL(), minted.Token, client.WithConnectFrame(), client.WithErrorHandler(func(error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Subscribe(e.ctx, client2, schema.EventFilter{Kinds: schema.AllKinds()})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(tenantA, client2, published{ev: hmacUpdated()})
	if ev := next(t, s); ev.Kind != schema.KindHmacKeysUpdated {
		t.Fatalf("event %+v", ev)
	}
}

// A connection without an Authorization header that does not authenticate
// with its first frame is closed with a code and a reason that say why: no
// frame in time, another frame first, an invalid, expired or not yet valid
// token, a token without the events scope, the tenant's connection bound.
func TestConnectFrameRefusals(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ConnectTimeout = 300 * time.Millisecond; c.MaxConnsPerTenant = 1 })
	mintAt := func(exp, nbf time.Time, scopes ...auth.Scope) string {
		tok, err := auth.Mint(secret, auth.Claims{Tenant: tenantA, Scopes: scopes, Clients: []string{client1}, ExpiresAt: exp, NotBefore: nbf})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	now := time.Now()
	for name, tc := range map[string]struct {
		first  *wire.Frame
		code   int
		reason string
	}{
		"no frame":        {nil, wire.CloseConnectTimeout, "no connect frame within 300ms"},
		"subscribe first": {&wire.Frame{Op: wire.OpSubscribe, ID: 1, ClientID: client1, Filter: &schema.EventFilter{}}, wire.CloseBadConnect, "connect"},
		"no token":        {&wire.Frame{Op: wire.OpConnect}, wire.CloseBadConnect, "connect"},
		"garbage token":   {&wire.Frame{Op: wire.OpConnect, Token: "a.b.c"}, wire.CloseUnauthenticated, "invalid token"},
		"expired":         {&wire.Frame{Op: wire.OpConnect, Token: mintAt(now.Add(-time.Second), time.Time{}, auth.ScopeEvents)}, wire.CloseUnauthenticated, "expired"},
		"not yet valid":   {&wire.Frame{Op: wire.OpConnect, Token: mintAt(now.Add(time.Hour), now.Add(time.Minute), auth.ScopeEvents)}, wire.CloseUnauthenticated, "not valid yet"},
		"no events scope": {&wire.Frame{Op: wire.OpConnect, Token: mintAt(now.Add(time.Hour), time.Time{}, auth.ScopeAdmin)}, wire.CloseForbidden, "events"},
	} {
		r := e.dialBare(wire.SubprotocolJSON)
		if tc.first != nil {
			r.send(*tc.first)
		}
		if code, reason := r.closed(); code != tc.code || !strings.Contains(reason, tc.reason) {
			t.Errorf("%s: closed %d %q, want %d saying %q", name, code, reason, tc.code, tc.reason)
		}
	}
	// The tenant's bound counts connections that authenticated.
	first := e.dialBare(wire.SubprotocolJSON)
	first.send(wire.Frame{Op: wire.OpConnect, Token: token(t, tenantA, client1)})
	if got := first.read(); got.Op != wire.OpConnected {
		t.Fatalf("first connection: %+v", got)
	}
	second := e.dialBare(wire.SubprotocolJSON)
	second.send(wire.Frame{Op: wire.OpConnect, Token: token(t, tenantA, client1)})
	if code, _ := second.closed(); code != wire.CloseTooManyConnections {
		t.Errorf("second connection of the tenant: closed %d, want %d", code, wire.CloseTooManyConnections)
	}
	// The SDK returns the refusal as the gateway's code and reason.
	_, err := client.Connect(e.ctx, e.wsURL(), "a.b.c", client.WithConnectFrame(), client.WithoutReconnect())
	var ge *client.GatewayError
	if !errors.As(err, &ge) || ge.Code != wire.CodeUnauthenticated || ge.Message != "invalid token" {
		t.Fatalf("SDK with a bad token: %v, want unauthenticated: invalid token", err)
	}
}

// A page on another origin opens a WebSocket only when the gateway allows
// its origin (-allowed-origins).
func TestBrowserOriginAllowedByPattern(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.OriginPatterns = []string{"localhost:*"} })
	dial := func(origin string) int {
		ws, resp, err := websocket.Dial(e.ctx, e.wsURL(), &websocket.DialOptions{
			HTTPHeader: http.Header{"Origin": {origin}}, Subprotocols: []string{wire.SubprotocolJSON}})
		if err != nil {
			return resp.StatusCode
		}
		_ = ws.CloseNow()
		return http.StatusSwitchingProtocols
	}
	if got := dial("http://localhost:3000"); got != http.StatusSwitchingProtocols {
		t.Errorf("allowed origin: %d", got)
	}
	if got := dial("https://evil.example"); got != http.StatusForbidden {
		t.Errorf("other origin: %d, want 403", got)
	}
}

// Issue 27, item 3: a connection token says it was minted (auth.Claims
// Minted) and mints no connection token: a 5 s token asking for an hour
// is refused, so no chain of tokens outlives the backend's.
func TestMintedConnectionTokenCannotMint(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TokenSecret = secret; c.MaxConnectionTokenTTL = time.Hour })
	admin := mintToken(t, tenantA, []auth.Scope{auth.ScopeAdmin}, auth.AllClients)
	status, first, code := postConnectionToken(t, e, tenantA, admin, `{"clients":["`+client1+`"],"ttl_seconds":5}`)
	if status != http.StatusCreated {
		t.Fatalf("mint: %d %s", status, code)
	}
	claims, err := e.g.cfg.Verifier.Verify(e.ctx, first.Token)
	if err != nil || !claims.Minted {
		t.Fatalf("the connection token's claims %+v, %v: want minted", claims, err)
	}
	if claims, err := e.g.cfg.Verifier.Verify(e.ctx, admin); err != nil || claims.Minted {
		t.Fatalf("the backend's token reads as minted: %+v, %v", claims, err)
	}
	for _, body := range []string{`{"clients":["` + client1 + `"],"ttl_seconds":3600}`, `{"clients":["` + client1 + `"],"ttl_seconds":1}`} {
		if status, _, code := postConnectionToken(t, e, tenantA, first.Token, body); status != http.StatusForbidden || code != "forbidden" {
			t.Errorf("a connection token minting %s: %d %s, want 403 forbidden", body, status, code)
		}
	}
}

// Issue 27, item 3: a token expiring in 30 s that asks for an hour gets a
// token that expires with it, never later.
func TestMintedTokenNeverOutlivesItsMinter(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TokenSecret = secret; c.MaxConnectionTokenTTL = time.Hour })
	exp := time.Now().Add(30 * time.Second).Truncate(time.Second)
	backend, err := auth.Mint(secret, auth.Claims{Tenant: tenantA, Scopes: []auth.Scope{auth.ScopeEvents}, Clients: []string{client1}, ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`{"clients":["` + client1 + `"],"ttl_seconds":3600}`, `{"clients":["` + client1 + `"]}`} {
		status, got, code := postConnectionToken(t, e, tenantA, backend, body)
		if status != http.StatusCreated {
			t.Fatalf("%s: %d %s", body, status, code)
		}
		if got.ExpiresUnixMS > exp.UnixMilli() {
			t.Errorf("%s: the minted token expires %v, after its minter (%v)", body, time.UnixMilli(got.ExpiresUnixMS), exp)
		}
		claims, err := e.g.cfg.Verifier.Verify(e.ctx, got.Token)
		if err != nil || claims.ExpiresAt.After(exp) {
			t.Errorf("%s: minted claims %+v, %v: expire after %v", body, claims, err, exp)
		}
	}
}
