package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/config"
)

// tokenTTL is how long the development tokens printed at start are valid.
const tokenTTL = 7 * 24 * time.Hour

func runAllInOne(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var (
		o         allinone.Options
		errs      config.Errs
		authFlags config.Auth
		keyFile   string
		origins   string
		drain     time.Duration
		quotas    config.Quotas
	)
	fs := flag.NewFlagSet("fabric run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config.String(fs, &o.DataDir, "data", "fabric-data", "folder for JetStream's files and the generated development secrets")
	config.Listen(fs, &o.Listen, "127.0.0.1:8080")
	config.String(fs, &o.NATSListen, "nats-listen", "127.0.0.1:4222", "client address of the embedded nats-server (port 0 picks a free one)")
	config.Bool(fs, &errs, &o.Production, "production", false, "refuse to generate secrets: FABRIC_JWT_SECRET and FABRIC_MASTER_KEY must be set")
	authFlags.RegisterFlags(fs, &errs)
	config.Origins(fs, &origins)
	config.Bool(fs, &errs, &o.SSEQueryToken, "sse-query-token", false, "with -production, accept SSE's access_token query parameter (a token in a URL lands in access logs); always accepted without -production")
	config.String(fs, &keyFile, "master-key-file", "", "file holding the master key as 64 hex digits (else FABRIC_MASTER_KEY)")
	config.Duration(fs, &errs, &drain, "drain-timeout", 10*time.Second, "how long a SIGTERM waits for in-flight work")
	config.Duration(fs, &errs, &o.SyncInterval, "sync-interval", 0, "how often JetStream fsyncs; 0 fsyncs every write before it is acknowledged (survives power loss), e.g. 2m trades that for speed")
	config.HTTPLimits(fs, &errs, &o.HTTPLimits)
	quotas.RegisterFlags(fs, &errs)
	config.Int(fs, &errs, &o.KeyPackagePool, "key-package-pool", clientstore.DefaultKeyPackagePool, "unconsumed KeyPackages a hosted client holds again after a join consumed one: fresh ones refill its pool")
	config.Duration(fs, &errs, &o.SelfUpdateAfter, "self-update-after", 0, "age of a hosted member's leaf after which converge commits a self-update for it, for post-compromise security (0: off; at least 1m)")
	if err := config.Parse(fs, args); err != nil {
		return err
	}
	config.ValidateListen(&errs, o.Listen)
	config.ValidateListen(&errs, o.NATSListen)
	quotas.Validate(&errs)
	o.Quotas, o.TenantInputBytes = quotas.ClientAPI(nil), quotas.TenantInputBytes()
	if o.SelfUpdateAfter != 0 && o.SelfUpdateAfter < time.Minute {
		errs.Addf("-self-update-after: %v; use 0 (off) or 1m or more", o.SelfUpdateAfter)
	}
	if o.KeyPackagePool < 1 || o.KeyPackagePool > clientstore.MaxKeyPackages {
		errs.Addf("-key-package-pool: %d; use 1 to %d", o.KeyPackagePool, clientstore.MaxKeyPackages)
	}
	if o.Production || authFlags.SecretFile != "" || os.Getenv("FABRIC_JWT_SECRET") != "" {
		o.JWTSecret = config.Secret(&errs, "FABRIC_JWT_SECRET", authFlags.SecretFile, auth.MinSecretLen)
	}
	o.TokenLifetimes, o.JWKSTTL, o.JWKSMinRefetch = authFlags.Lifetimes, authFlags.JWKSTTL, authFlags.JWKSMinRefetch
	o.TenantKeys = authFlags.TenantKeys(&errs)
	o.OriginPatterns = config.ParseOrigins(&errs, origins)
	if o.Production || keyFile != "" || os.Getenv("FABRIC_MASTER_KEY") != "" {
		o.MasterKey = config.MasterKey(&errs, keyFile)
	}
	if err := errs.Err(); err != nil {
		return err
	}
	o.Logger = log

	f, err := allinone.Start(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "fabric is running (tenant %q)\n", allinone.DevTenant)
	fmt.Fprintf(stdout, "  HTTP API   %s\n", f.URL)
	fmt.Fprintf(stdout, "  WebSocket  %s/v1/events\n", "ws"+f.URL[len("http"):])
	fmt.Fprintf(stdout, "  metrics    %s/metrics\n", f.URL)
	fmt.Fprintf(stdout, "  console    %s/console/\n", f.URL)
	fmt.Fprintf(stdout, "  NATS       %s\n", f.NATSURL)
	if !o.Production {
		fmt.Fprintf(stdout, "development tokens (valid %s):\n", tokenTTL)
		for _, s := range auth.Scopes() {
			tok, err := f.Token(tokenTTL, s)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "  %-8s %s\n", s, tok)
		}
		fmt.Fprintf(stdout, "try: go run ./cmd/fabric demo   (in another terminal)\n")
	}

	select {
	case <-ctx.Done():
	case <-f.Stopped():
		return f.Err()
	}
	log.Info("draining")
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	return f.Shutdown(sctx)
}
