package allinone

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/auth"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startFabric starts an all-in-one on free loopback ports in a fresh data
// directory unless o names one, and shuts it down when the test ends.
func startFabric(t *testing.T, o Options) *Fabric {
	t.Helper()
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	o.Listen, o.NATSListen = "127.0.0.1:0", "127.0.0.1:0"
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return f
}

// An input answered queued is on disk: the embedded server fsyncs every
// write unless told to trade that for speed.
func TestAcknowledgedInputIsSyncedByDefault(t *testing.T) {
	t.Parallel()
	jsc := startFabric(t, Options{}).ns.NATS().JetStreamConfig()
	if !jsc.SyncAlways {
		t.Errorf("default all-in-one: JetStream sync_always is off (sync interval %v)", jsc.SyncInterval)
	}
	jsc = startFabric(t, Options{SyncInterval: 2 * time.Minute}).ns.NATS().JetStreamConfig()
	if jsc.SyncAlways || jsc.SyncInterval != 2*time.Minute {
		t.Errorf("SyncInterval 2m: sync_always %t, interval %v", jsc.SyncAlways, jsc.SyncInterval)
	}
}

// A token whose tenant is not a tenant id is refused with 401 and the
// reason on every surface: each role's HTTP API, SSE (header and query
// token) and the WebSocket handshake, never 503 or a later failure.
func TestInvalidTenantInTokenIs401OnEverySurface(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef-allinone")
	f := startFabric(t, Options{JWTSecret: secret})
	all := []auth.Scope{auth.ScopeAdmin, auth.ScopeIngest, auth.ScopeEvents, auth.ScopeSignals}
	for _, tenant := range []string{"*", ">", "bad.*", "*.x", "b*"} {
		tok, err := auth.Mint(secret, auth.Claims{Tenant: tenant, Scopes: all, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		want401OnEverySurface(t, f, fmt.Sprintf("tenant %q", tenant), DevTenant, tok, "invalid tenant")
		own, _ := http.NewRequest(http.MethodGet, f.URL+"/v1/tenants/"+url.PathEscape(tenant)+"/clients/abab/events?access_token="+tok, nil)
		if r := send(t, own); r.status != http.StatusUnauthorized || !strings.Contains(r.message, "invalid tenant") {
			t.Errorf("tenant %q: SSE of its own tenant: %+v", tenant, r)
		}
	}
}

// surfaceAnswer is how one surface answered a token.
type surfaceAnswer struct {
	status        int
	code, message string
}

// want401OnEverySurface presents tok, with every scope, on every surface
// that verifies tokens, for tenant's routes: each role's HTTP API, SSE
// (header and query token), the WebSocket handshake and its connect frame.
// Each must answer 401 unauthenticated with a reason containing reason.
func want401OnEverySurface(t *testing.T, f *Fabric, what, tenant, tok, reason string) {
	t.Helper()
	for surface, a := range everySurface(t, f, tenant, tok) {
		if a.status != http.StatusUnauthorized || (a.code != "" && a.code != "unauthenticated") || !strings.Contains(a.message, reason) {
			t.Errorf("%s: %s: %+v, want 401 unauthenticated saying %q", what, surface, a, reason)
		}
	}
}

// everySurface presents tok on every surface and returns each answer; the
// WebSocket's is its handshake status (101 when upgraded).
func everySurface(t *testing.T, f *Fabric, tenant, tok string) map[string]surfaceAnswer {
	t.Helper()
	const client = "abab"
	msgID := strings.Repeat("ab", 32)
	base := f.URL + "/v1/tenants/" + tenant
	routes := []struct{ method, path, body string }{
		{http.MethodPost, base + "/clients", `{"inbox_id":"` + msgID + `"}`},
		{http.MethodGet, base + "/clients/" + client, ""},
		{http.MethodPut, base + "/clients/" + client + "/consent", `{}`},
		{http.MethodPost, base + "/clients/" + client + "/signals", `{}`},
		{http.MethodPost, base + "/transport", `{}`},
		{http.MethodGet, base + "/outcomes/" + msgID, ""},
		{http.MethodGet, base + "/clients/" + client + "/events", ""},
	}
	out := map[string]surfaceAnswer{}
	for _, rt := range routes {
		req, _ := http.NewRequest(rt.method, rt.path, strings.NewReader(rt.body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		out[rt.method+" "+strings.TrimPrefix(rt.path, f.URL)] = send(t, req)
	}
	sse, _ := http.NewRequest(http.MethodGet, base+"/clients/"+client+"/events?access_token="+tok, nil)
	out["SSE access_token"] = send(t, sse)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(f.URL, "http")+"/v1/events", &websocket.DialOptions{
		Subprotocols: []string{"fabric.v1.json"},
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + tok}},
	})
	switch {
	case err == nil:
		ws.CloseNow()
		out["WebSocket handshake"] = surfaceAnswer{status: http.StatusSwitchingProtocols}
	case resp != nil:
		out["WebSocket handshake"] = readAnswer(resp)
	default:
		t.Fatalf("WebSocket dial: %v", err)
	}
	out["WebSocket connect frame"] = connectFrameAnswer(t, f, tok)
	return out
}

// connectFrameAnswer opens a WebSocket without an Authorization header,
// sends tok in its connect frame and returns the gateway's answer: 101 for
// connected, else the HTTP status the close code stands for (4401 is 401)
// and the close reason.
func connectFrameAnswer(t *testing.T, f *Fabric, tok string) surfaceAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(f.URL, "http")+"/v1/events", &websocket.DialOptions{Subprotocols: []string{"fabric.v1.json"}})
	if err != nil {
		t.Fatalf("WebSocket dial without a header: %v", err)
	}
	defer ws.CloseNow()
	connect, _ := json.Marshal(map[string]string{"op": "connect", "token": tok})
	if err := ws.Write(ctx, websocket.MessageText, connect); err != nil {
		t.Fatalf("connect frame: %v", err)
	}
	_, b, err := ws.Read(ctx)
	var ce websocket.CloseError
	switch {
	case err == nil && strings.Contains(string(b), `"connected"`):
		return surfaceAnswer{status: http.StatusSwitchingProtocols}
	case errors.As(err, &ce):
		return surfaceAnswer{status: int(ce.Code) - 4000, message: ce.Reason}
	}
	t.Fatalf("connect frame answered %q, %v", b, err)
	return surfaceAnswer{}
}

// send sends req and reads its status and error body.
func send(t *testing.T, req *http.Request) surfaceAnswer {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	return readAnswer(resp)
}

// readAnswer reads resp's status and error body.
func readAnswer(resp *http.Response) surfaceAnswer {
	var body struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return surfaceAnswer{status: resp.StatusCode, code: body.Error.Code, message: body.Error.Message}
}

// listeningPorts returns the TCP ports this process listens on, read from
// /proc: the sockets in LISTEN state whose inodes are among its descriptors.
func listeningPorts(t *testing.T) map[int]bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil {
			if ino, ok := strings.CutPrefix(l, "socket:["); ok {
				inodes[strings.TrimSuffix(ino, "]")] = true
			}
		}
	}
	ports := map[int]bool{}
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] {
				continue
			}
			port, err := strconv.ParseInt(f[1][strings.LastIndexByte(f[1], ':')+1:], 16, 32)
			if err == nil {
				ports[int(port)] = true
			}
		}
	}
	return ports
}

// The all-in-one listens on its HTTP and NATS addresses and nowhere else:
// every listener is bounded and on the interface it was told. It reads the
// whole process's listeners, so it does not run in parallel.
func TestListensOnlyWhereTold(t *testing.T) {
	f := startFabric(t, Options{})
	want := map[int]bool{}
	for _, u := range []string{f.URL, f.NATSURL} {
		port, err := strconv.Atoi(u[strings.LastIndexByte(u, ':')+1:])
		if err != nil {
			t.Fatal(err)
		}
		want[port] = true
	}
	// Roles start their listeners in the background: watch for a second.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if got := listeningPorts(t); !maps.Equal(got, want) {
			t.Fatalf("listening on ports %v, want only %v", got, want)
		}
	}
}
