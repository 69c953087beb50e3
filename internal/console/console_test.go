package console

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
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
