package api_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/operations"
)

// headerNamed finds the header a refusal says is missing or wrong, as the
// roles word it ("an Idempotency-Key header of 1 to 255 bytes is
// required", "Idempotency-Key header is required").
var headerNamed = regexp.MustCompile(`\b([A-Z][A-Za-z0-9]*(?:-[A-Z][A-Za-z0-9]*)+) header\b`)

// notParameters are headers OpenAPI describes elsewhere (the request body's
// media type, the security scheme): a parameter of these names is ignored.
var notParameters = []string{"Accept", "Content-Type", "Authorization"}

// pathValues fill a route's path parameters in a probe.
func pathValues(clientID string) map[string]string {
	id := strings.Repeat("ab", 32)
	return map[string]string{"tenant": allinone.DevTenant, "client_id": clientID, "group_id": id, "inbox_id": id,
		"message_id": id, "operation_id": id, "entity_kind": "inbox", "entity": id}
}

// requiredHeaders asks a real all-in-one which headers each route the Go
// code serves requires: a request without any header but the token, with
// an empty JSON body, whose 400 names a header is sent again with that
// header set; the header is required when the second answer no longer
// names it. The WebSocket route's handshake headers are WebSocket's; an
// SSE stream that opens requires nothing more.
func requiredHeaders(t *testing.T, routes []string) map[string][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := allinone.Start(ctx, allinone.Options{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:0",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := f.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	token, err := f.Token(time.Hour, auth.Scopes()...)
	if err != nil {
		t.Fatal(err)
	}
	call := func(method, path string, header http.Header, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, f.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if header != nil {
			req.Header = header.Clone()
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 == 2 && resp.Header.Get("Content-Type") == "text/event-stream" {
			return resp.StatusCode, "" // SSE: a stream that does not end
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := call(http.MethodPost, "/v1/tenants/"+allinone.DevTenant+"/clients", nil, `{"inbox_id":"`+strings.Repeat("cd", 32)+`"}`)
	var reg struct {
		ClientID string `json:"client_id"`
	}
	if code != http.StatusCreated && code != http.StatusOK || json.Unmarshal([]byte(body), &reg) != nil || reg.ClientID == "" {
		t.Fatalf("registering a client: %d %s", code, body)
	}
	values := pathValues(reg.ClientID)
	out := map[string][]string{}
	for _, r := range routes {
		m := routePattern.FindStringSubmatch(r)
		if m[2] == "/v1/events" {
			continue
		}
		path := pathParam.ReplaceAllStringFunc(m[2], func(p string) string {
			v, ok := values[p[1:len(p)-1]]
			if !ok {
				t.Fatalf("%s: no probe value for %s", r, p)
			}
			return v
		})
		header := http.Header{}
		for range 4 { // a route may require several headers, named one at a time
			code, body := call(m[1], path, header, "{}")
			named := headerNamed.FindStringSubmatch(body)
			if code != http.StatusBadRequest || named == nil || header.Get(named[1]) != "" {
				break
			}
			header.Set(named[1], "probe-"+hex.EncodeToString([]byte(r))[:16])
			if _, again := call(m[1], path, header, "{}"); !strings.Contains(again, named[1]+" header") {
				out[r] = append(out[r], named[1])
			}
		}
	}
	return out
}

// diffHeaders reports each header a route requires that openapi.yaml does
// not declare on it as a required header parameter.
func diffHeaders(api openAPI, required map[string][]string) []string {
	var out []string
	for _, r := range slices.Sorted(maps.Keys(required)) {
		m := routePattern.FindStringSubmatch(r)
		op, ok := api.Paths[m[2]][strings.ToLower(m[1])]
		if !ok {
			continue // diffRoutes reports the route
		}
		declared := map[string]bool{}
		for _, p := range op.Parameters {
			if p.Ref != "" {
				p = api.Components.Parameters[strings.TrimPrefix(p.Ref, "#/components/parameters/")]
			}
			if p.In == "header" && p.Required {
				declared[http.CanonicalHeaderKey(p.Name)] = true
			}
		}
		for _, h := range required[r] {
			if !declared[http.CanonicalHeaderKey(h)] && !slices.Contains(notParameters, h) {
				out = append(out, fmt.Sprintf("openapi.yaml: %s requires the header %s, which it does not declare as a required header parameter", r, h))
			}
		}
	}
	return out
}

// Issue 28, item 6: every header a route requires is declared in
// openapi.yaml, so a client generated from it sends it (the operations and
// signals routes refuse a request without an Idempotency-Key with 400).
func TestContractDeclaresTheHeadersRoutesRequire(t *testing.T) {
	required := requiredHeaders(t, goRoutes(t))
	// The probe finds what it must, or it proves nothing.
	for _, r := range []string{operations.RouteSend, "POST /v1/tenants/{tenant}/clients/{client_id}/signals"} {
		if !slices.Contains(required[r], operations.HeaderIdempotencyKey) {
			t.Errorf("the probe did not find that %s requires %s: %v", r, operations.HeaderIdempotencyKey, required)
		}
	}
	for _, p := range diffHeaders(readOpenAPI(t), required) {
		t.Error(p)
	}
}

// The header check fails for a route that requires a header the contract
// does not declare.
func TestContractCheckCatchesAnUndeclaredHeader(t *testing.T) {
	got := diffHeaders(readOpenAPI(t), map[string][]string{"POST /v1/tenants/{tenant}/transport": {"X-Fabric-Probe"}})
	if !containsAll(got, "POST /v1/tenants/{tenant}/transport requires the header X-Fabric-Probe") {
		t.Errorf("an undeclared required header is not caught: %q", got)
	}
}
