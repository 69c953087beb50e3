package read_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/fabric-mls/fabric/internal/allinone"
)

// A page of an origin -allowed-origins names reads through the read API
// from a browser: the preflight is answered and the answer carries the
// origin; a page of another origin gets neither, so its browser refuses it.
func TestReadAPICORSFollowsAllowedOrigins(t *testing.T) {
	t.Parallel()
	fx := startWith(t, allinone.Options{OriginPatterns: []string{"app.example.com", "localhost:*"}})
	url := fx.f.URL + "/v1/tenants/" + allinone.DevTenant + "/clients/" + fx.hosted.ClientID + "/conversations"
	do := func(method, origin string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, url, nil)
		req.Header.Set("Origin", origin)
		if method == http.MethodOptions {
			req.Header.Set("Access-Control-Request-Method", "GET")
			req.Header.Set("Access-Control-Request-Headers", "authorization")
		} else {
			req.Header.Set("Authorization", "Bearer "+fx.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, origin := range []string{"https://app.example.com", "http://localhost:5173"} {
		pre := do(http.MethodOptions, origin)
		if pre.StatusCode != http.StatusNoContent || pre.Header.Get("Access-Control-Allow-Origin") != origin ||
			!strings.Contains(strings.ToLower(pre.Header.Get("Access-Control-Allow-Headers")), "authorization") ||
			!strings.Contains(pre.Header.Get("Access-Control-Allow-Methods"), "GET") {
			t.Fatalf("preflight from %s: %d %v", origin, pre.StatusCode, pre.Header)
		}
		get := do(http.MethodGet, origin)
		if get.StatusCode != http.StatusOK || get.Header.Get("Access-Control-Allow-Origin") != origin {
			t.Fatalf("GET from %s: %d %v", origin, get.StatusCode, get.Header)
		}
	}
	const other = "https://evil.example.com"
	if pre := do(http.MethodOptions, other); pre.StatusCode != http.StatusForbidden || pre.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("preflight from %s: %d %v", other, pre.StatusCode, pre.Header)
	}
	if get := do(http.MethodGet, other); get.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("GET from %s allowed: %v", other, get.Header)
	}
}
