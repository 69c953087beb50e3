package tests

import (
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
)

// Issue 28, item 4: `fabric run` prints a development token for each scope
// README's API section names (admin, ingest, events, signals, read, send),
// and each printed token carries exactly its scope under the fabric's
// secret.
func TestFabricRunPrintsATokenForEveryScope(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	p := start(t, filepath.Join(binaries(t), "fabric"), nil,
		"run", "-data", data, "-listen", freeAddr(t), "-nats-listen", "127.0.0.1:0")
	p.waitLine(t, "try:", time.Minute) // printed after the tokens

	raw, err := os.ReadFile(filepath.Join(data, "jwt-secret"))
	if err != nil {
		t.Fatal(err)
	}
	secret, err := hex.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	readme := []auth.Scope{"admin", "ingest", "events", "signals", "read", "send"}
	if !slices.Equal(slices.Sorted(slices.Values(readme)), slices.Sorted(slices.Values(auth.Scopes()))) {
		t.Errorf("README names the scopes %v, internal/auth has %v", readme, auth.Scopes())
	}
	for _, s := range readme {
		tok := p.waitLine(t, string(s)+" ", time.Second)
		claims, err := v.Verify(context.Background(), tok)
		if err != nil {
			t.Errorf("the %s token is refused: %v", s, err)
			continue
		}
		if !slices.Equal(claims.Scopes, []auth.Scope{s}) || claims.Tenant != "dev" {
			t.Errorf("the %s token grants %v of tenant %q", s, claims.Scopes, claims.Tenant)
		}
	}
}
