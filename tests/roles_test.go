package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
)

// TestEachRoleRunsAloneWithEveryDocumentedMetric starts ingest, converge
// and fanout as separate processes against the NATS server of an all-in-one
// fabric, each as its role's NATS user, waits until each is ready, and
// checks each role's /metrics with promtool and against README's Metrics
// table: on a fresh start every documented metric is served, so dashboards
// and alerts work on a new system.
func TestEachRoleRunsAloneWithEveryDocumentedMetric(t *testing.T) {
	t.Parallel()
	f := startAllInOne(t)
	t.Run("all-in-one", func(t *testing.T) {
		checkDocumentedMetrics(t, httpGet(t, f.url+"/metrics"), "ingest", "converge", "fanout", "stores", "every role")
	})
	bin := binaries(t)
	env := []string{
		"FABRIC_NATS_URL=" + f.natsURL,
		"FABRIC_JWT_SECRET=" + strings.Repeat("s", 32),
		"FABRIC_MASTER_KEY=" + strings.Repeat("ab", 32),
	}
	for _, role := range []string{"ingest", "converge", "fanout"} {
		t.Run(role, func(t *testing.T) {
			addr := freeAddr(t)
			args := []string{"-listen", addr, "-nats-user", role, "-nats-inbox-prefix", allinone.InboxPrefix(role)}
			switch role {
			case "converge":
				args = append(args, "-worker-id", "standalone")
			case "ingest":
				args = append(args, "-client-api=false") // the stores are user api's
			}
			pw, err := os.ReadFile(allinone.NATSPasswordFile(f.data, role))
			if err != nil {
				t.Fatal(err)
			}
			start(t, filepath.Join(bin, role), append(env, "FABRIC_NATS_PASSWORD="+strings.TrimSpace(string(pw))), args...)
			base := "http://" + addr
			waitReady(t, base+"/readyz", time.Minute)
			metrics := httpGet(t, base+"/metrics")
			checkDocumentedMetrics(t, metrics, role, "every role")
			promtool(t, metrics, "check", "metrics")
		})
	}
}

// TestConfigurationIsValidatedAtStart starts each binary with bad settings
// and checks that it refuses to run and names every bad setting.
func TestConfigurationIsValidatedAtStart(t *testing.T) {
	t.Parallel()
	bin := binaries(t)
	cases := []struct {
		bin  string
		env  []string
		args []string
		want []string
	}{
		{"ingest", nil, []string{"-nats-url", "http//nope", "-listen", "8080"}, []string{"-nats-url", "-listen", "FABRIC_JWT_SECRET", "FABRIC_MASTER_KEY"}},
		{"converge", []string{"FABRIC_LEASE_TTL=soon"}, nil, []string{"FABRIC_LEASE_TTL", "FABRIC_MASTER_KEY"}},
		{"fanout", nil, []string{"-replicas", "2"}, []string{"-replicas", "FABRIC_JWT_SECRET"}},
		{"fabric", []string{"FABRIC_PRODUCTION=true"}, []string{"run", "-data", t.TempDir()}, []string{"FABRIC_JWT_SECRET", "FABRIC_MASTER_KEY"}},
	}
	for _, c := range cases {
		t.Run(c.bin, func(t *testing.T) {
			out, code := runToExit(t, filepath.Join(bin, c.bin), c.env, c.args...)
			if code == 0 {
				t.Fatalf("%s started with bad settings:\n%s", c.bin, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("%s: the error does not name %s:\n%s", c.bin, w, out)
				}
			}
		})
	}
}
