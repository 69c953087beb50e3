package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A bad setting stops the start with a message naming it, and every problem
// is reported at once.
func TestParseReportsEveryProblem(t *testing.T) {
	t.Setenv("FABRIC_JWT_SECRET", "short")
	t.Setenv("FABRIC_MASTER_KEY", "not-hex")
	_, _, err := parse([]string{"-nats-url", "http://x", "-rate", "0", "-max-batch", "-1", "-listen", "nope"})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"-nats-url", "-rate", "-max-batch", "-listen", "FABRIC_JWT_SECRET", "FABRIC_MASTER_KEY"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
}

func TestParseDefaults(t *testing.T) {
	t.Setenv("FABRIC_JWT_SECRET", strings.Repeat("s", 32))
	t.Setenv("FABRIC_MAX_BATCH", "50")
	t.Setenv("FABRIC_MASTER_KEY", strings.Repeat("ab", 32))
	o, sec, err := parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.jwt) != 32 || len(sec.masterKey) != 32 || o.maxBatch != 50 || !o.natsIntake || !o.clientAPI {
		t.Fatalf("options = %+v", o)
	}
}

// Without the client API, ingest still needs the master key: the group
// event keys it peels transport messages with are sealed under it.
func TestParseWithoutClientAPINeedsMasterKey(t *testing.T) {
	t.Setenv("FABRIC_JWT_SECRET", strings.Repeat("s", 32))
	t.Setenv("FABRIC_MASTER_KEY", "")
	if _, _, err := parse([]string{"-client-api=false"}); err == nil || !strings.Contains(err.Error(), "FABRIC_MASTER_KEY") {
		t.Fatalf("parse without a master key: %v, want an error naming FABRIC_MASTER_KEY", err)
	}
	t.Setenv("FABRIC_MASTER_KEY", strings.Repeat("ab", 32))
	if _, sec, err := parse([]string{"-client-api=false"}); err != nil || len(sec.masterKey) != 32 {
		t.Fatalf("parse: %v, master key %d bytes", err, len(sec.masterKey))
	}
}

// The binary's wiring end to end: it provisions the streams, serves the API
// on its routes beside /healthz, /readyz and /metrics, and drains and
// returns when its context ends.
func TestRunServesAndDrains(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The binary provisions its streams itself.
	srv := natstest.Start(t, natstest.OverLoopback(), natstest.WithoutStreams()).Server
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	secret := strings.Repeat("k", 32)
	t.Setenv("FABRIC_JWT_SECRET", secret)
	t.Setenv("FABRIC_MASTER_KEY", strings.Repeat("ab", 32))

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"-nats-url", srv.ClientURL(), "-listen", addr}, slog.New(slog.DiscardHandler))
	}()
	base := "http://" + addr
	eventually.True(t, "ingest ready", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	tok, err := auth.Mint([]byte(secret), auth.Claims{Tenant: "acme", Scopes: []auth.Scope{auth.ScopeIngest}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/tenants/acme/transport", strings.NewReader(`{"v":1,"group":"0a","kind":"mls","payload":"000102"}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"category":"invalid_encoding"`) {
		t.Fatalf("intake: %d %s", resp.StatusCode, body)
	}
	// The client API is served beside intake: registration works.
	admin, err := auth.Mint([]byte(secret), auth.Claims{Tenant: "acme", Scopes: []auth.Scope{auth.ScopeAdmin}, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	req, _ = http.NewRequest(http.MethodPost, base+"/v1/tenants/acme/clients", strings.NewReader(`{"inbox_id":"`+strings.Repeat("ab", 32)+`"}`))
	req.Header.Set("Authorization", "Bearer "+admin)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 || !strings.Contains(string(body), `"client_id"`) {
		t.Fatalf("register: %d %s", resp.StatusCode, body)
	}
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `fabric_ingest_inputs_total{category="invalid_encoding",class="malformed",status="rejected",transport="http"} 1`) {
		t.Fatal("metrics do not count the input")
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
}
