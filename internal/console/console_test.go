package console

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// The console serves its page and script under /console/, and its filter
// offers every kind the fabric knows.
func TestConsoleServesPageAndKinds(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/console/"); code != 200 || !strings.Contains(body, "fabric console") {
		t.Fatalf("/console/: %d", code)
	}
	if code, body := get("/console/console.js"); code != 200 || !strings.Contains(body, `op: "connect"`) {
		t.Fatalf("/console/console.js: %d", code)
	}
	code, body := get("/console/kinds.json")
	var kinds []schema.EventKind
	if code != 200 || json.Unmarshal([]byte(body), &kinds) != nil || !slices.Equal(kinds, schema.AllKinds()) {
		t.Fatalf("/console/kinds.json: %d %s", code, body)
	}
	if code, _ := get("/console/missing.js"); code != 404 {
		t.Fatalf("a missing file: %d", code)
	}
}

// Issue 27, item 4: every answer under /console/ says it may not be framed
// (clickjacking the admin token's form), may load and run only the
// console's own files (no inline script or style, no other origin), is
// not sniffed into another type and sends no referrer; and the page holds
// nothing inline that policy would block, so it still works under it.
func TestConsoleSendsSecurityHeaders(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	want := map[string]string{
		"X-Frame-Options":        "DENY",
		"X-Content-Type-Options": "nosniff",
		"Referrer-Policy":        "no-referrer",
	}
	for _, path := range []string{"/console/", "/console/console.js", "/console/console.css", "/console/kinds.json", "/console/missing.js"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for h, v := range want {
			if got := resp.Header.Get(h); got != v {
				t.Errorf("%s: %s %q, want %q", path, h, got, v)
			}
		}
		csp := map[string]string{}
		for d := range strings.SplitSeq(resp.Header.Get("Content-Security-Policy"), ";") {
			name, value, _ := strings.Cut(strings.TrimSpace(d), " ")
			csp[name] = value
		}
		for d, v := range map[string]string{"default-src": "'self'", "frame-ancestors": "'none'", "object-src": "'none'", "base-uri": "'none'"} {
			if csp[d] != v {
				t.Errorf("%s: Content-Security-Policy %s %q, want %q", path, d, csp[d], v)
			}
		}
		for d, v := range csp {
			if strings.Contains(v, "unsafe") || strings.Contains(v, "*") || strings.Contains(v, "data:") {
				t.Errorf("%s: Content-Security-Policy %s %s allows more than the console's own files", path, d, v)
			}
		}
		if path == "/console/" {
			if inline := regexp.MustCompile(`(?i)<style|style=|<script[^>]*>[^<]|javascript:|\son[a-z]+=`).FindString(string(body)); inline != "" {
				t.Errorf("the page holds %q, which its policy blocks", inline)
			}
		}
	}
}
