package tests

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
)

// Issue 28, item 8: `fabric token` prints a token a real role accepts, from
// the secret or key the deployment configures its roles with: the HS256
// secret (FABRIC_JWT_SECRET, as deploy/ hands it to the roles, or
// -jwt-secret-file), a tenant's Ed25519 key whose public half is in the
// role's -tenant-keys, and an all-in-one's generated secret (-data). The
// role here is fanout as a process, configured as deploy/ configures it;
// its admin route GET /v1/tenants/{tenant}/subscriptions answers 200 to the
// token, 403 to the token on another tenant.
func TestFabricTokenIsAcceptedByARealRole(t *testing.T) {
	t.Parallel()
	f := startAllInOne(t)
	bin := binaries(t)
	dir := t.TempDir()
	secret := strings.Repeat("k", 40)
	secretFile := filepath.Join(dir, "jwt-secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "globex.pem")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := json.Marshal(map[string]any{"tenants": map[string]any{"globex": map[string]any{
		"issuer": "https://id.globex.example", "audience": "fabric",
		"keys": []any{map[string]string{"kid": "k1", "pem": string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}))}},
	}}})
	keysFile := filepath.Join(dir, "tenant-keys.json")
	if err := os.WriteFile(keysFile, keys, 0o600); err != nil {
		t.Fatal(err)
	}

	pw, err := os.ReadFile(allinone.NATSPasswordFile(f.data, "fanout"))
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	start(t, filepath.Join(bin, "fanout"), []string{"FABRIC_NATS_URL=" + f.natsURL, "FABRIC_JWT_SECRET=" + secret,
		"FABRIC_NATS_PASSWORD=" + strings.TrimSpace(string(pw))},
		"-listen", addr, "-nats-user", "fanout", "-nats-inbox-prefix", allinone.InboxPrefix("fanout"), "-tenant-keys", keysFile)
	fanoutURL := "http://" + addr
	waitReady(t, fanoutURL+"/readyz", time.Minute)

	status := func(base, tenant, token string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/tenants/"+tenant+"/subscriptions", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	mint := func(t *testing.T, env []string, args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "fabric"), append([]string{"token"}, args...)...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		tok := strings.TrimSpace(string(out))
		if err != nil || strings.ContainsAny(tok, " \n") || strings.Count(tok, ".") != 2 {
			t.Fatalf("fabric token %s: %v, want one token on stdout:\n%s%s", strings.Join(args, " "), err, out, stderr.String())
		}
		return tok
	}
	for name, c := range map[string]struct {
		env    []string
		args   []string
		base   string
		tenant string
	}{
		"FABRIC_JWT_SECRET": {[]string{"FABRIC_JWT_SECRET=" + secret}, []string{"-tenant", "acme"}, fanoutURL, "acme"},
		"-jwt-secret-file":  {nil, []string{"-tenant", "acme", "-scopes", "admin,events", "-ttl", "10m", "-jwt-secret-file", secretFile}, fanoutURL, "acme"},
		"-key-file":         {nil, []string{"-tenant", "globex", "-key-file", keyFile, "-kid", "k1", "-issuer", "https://id.globex.example", "-audience", "fabric"}, fanoutURL, "globex"},
		"-data":             {nil, []string{"-tenant", "dev", "-data", f.data}, f.url, "dev"},
	} {
		t.Run(name, func(t *testing.T) {
			tok := mint(t, c.env, c.args...)
			if got := status(c.base, c.tenant, tok); got != http.StatusOK {
				t.Errorf("the role answered %d to the token, want 200", got)
			}
			if got := status(c.base, "initech", tok); got != http.StatusForbidden {
				t.Errorf("the role answered %d to the token on another tenant, want 403", got)
			}
		})
	}

	// What the roles would refuse is refused here, saying why.
	for _, c := range []struct {
		env  []string
		args []string
		says string
	}{
		{nil, []string{"-tenant", "acme"}, "FABRIC_JWT_SECRET is not set"},
		{[]string{"FABRIC_JWT_SECRET=" + secret}, []string{"-tenant", "acme", "-scopes", "root"}, `unknown scope "root"`},
		{[]string{"FABRIC_JWT_SECRET=" + secret}, []string{"-tenant", "acme", "-ttl", "200h"}, "-max-token-lifetime"},
		{[]string{"FABRIC_JWT_SECRET=" + secret}, []string{}, "-tenant is required"},
		{[]string{"FABRIC_JWT_SECRET=" + secret}, []string{"-tenant", "acme", "-key-file", keyFile}, "one of"},
	} {
		out, code := runToExit(t, filepath.Join(bin, "fabric"), c.env, append([]string{"token"}, c.args...)...)
		if code != 1 || !strings.Contains(out, c.says) {
			t.Errorf("fabric token %s: exit status %d, want 1 saying %q:\n%s", strings.Join(c.args, " "), code, c.says, out)
		}
	}
}
