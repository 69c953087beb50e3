package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bridge"
	"github.com/fabric-mls/fabric/internal/config"
	"github.com/fabric-mls/fabric/internal/ops"
)

// bridgeTokenTTL is how long a token minted from -to-data is used; it is
// minted again halfway.
const bridgeTokenTTL = time.Hour

// runBridge forwards one tenant's outbound stream of a source fabric (its
// NATS) to a destination fabric's transport endpoint (docs/outbound.md,
// Bridge).
func runBridge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		n                 config.NATS
		errs              config.Errs
		cfg               bridge.Config
		listen, tokenFile string
		fromData, toData  string
		drain             time.Duration
	)
	fs := flag.NewFlagSet("fabric bridge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n.RegisterFlags(fs, &errs)
	config.String(fs, &fromData, "from-data", "", "the source all-in-one's data folder: connect as its NATS user bridge with the password it generated (instead of -nats-user and FABRIC_NATS_PASSWORD)")
	config.String(fs, &cfg.Tenant, "tenant", allinone.DevTenant, "the source tenant whose outbound subjects (fabric.out.<tenant>.*) are forwarded")
	config.String(fs, &cfg.Durable, "durable", bridge.DefaultDurable, "name of the bridge's durable consumer on FABRIC_EVENTS (one per tenant and destination)")
	config.String(fs, &cfg.Destination, "to", "", "base URL of the destination fabric's HTTP API, like http://127.0.0.1:8080 (required)")
	config.String(fs, &cfg.DestinationTenant, "to-tenant", "", "the tenant at the destination (default: -tenant)")
	config.String(fs, &tokenFile, "token-file", "", "file holding the destination's bearer token, scope ingest, read at every post (else FABRIC_BRIDGE_TOKEN)")
	config.String(fs, &toData, "to-data", "", "the destination all-in-one's data folder, to mint a development ingest token (instead of -token-file)")
	config.Int(fs, &errs, &cfg.MaxBatch, "max-batch", bridge.DefaultMaxBatch, "messages per post; within the destination's -max-batch")
	config.Int(fs, &errs, &cfg.MaxBytes, "max-bytes", bridge.DefaultMaxBytes, "bytes of messages per post; within the destination's -max-body")
	config.Duration(fs, &errs, &cfg.MaxBackoff, "max-backoff", bridge.DefaultMaxBackoff, "longest wait between two posts the destination did not take (network errors, 5xx)")
	config.Listen(fs, &listen, "127.0.0.1:8090")
	config.Duration(fs, &errs, &drain, "drain-timeout", 5*time.Second, "how long a SIGTERM waits for the HTTP server")
	if err := config.Parse(fs, args); err != nil {
		return err
	}
	if fromData != "" {
		if n.User != "" || n.Creds != "" {
			errs.Addf("-from-data excludes -nats-user and -nats-creds: choose one")
		}
		pw, err := os.ReadFile(allinone.NATSPasswordFile(fromData, allinone.UserBridge))
		if err != nil {
			errs.Addf("-from-data: %v", err)
		} else {
			n.User, n.Password = allinone.UserBridge, strings.TrimSpace(string(pw))
		}
	}
	n.Validate(&errs)
	config.ValidateListen(&errs, listen)
	if u, err := url.Parse(cfg.Destination); cfg.Destination == "" {
		errs.Addf("-to is required")
	} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs.Addf("-to: %q is not an http:// or https:// URL with a host", cfg.Destination)
	}
	if cfg.MaxBatch < 1 || cfg.MaxBytes < 1 || cfg.MaxBackoff <= 0 {
		errs.Addf("-max-batch, -max-bytes and -max-backoff must be positive")
	}
	cfg.Token = bridgeToken(&errs, cfg.Tenant, cfg.DestinationTenant, tokenFile, toData)
	if err := errs.Err(); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	reg := ops.NewRegistry()
	cfg.Registerer, cfg.Logger = reg, log
	nc, err := n.Connect("fabric bridge " + cfg.Durable)
	if err != nil {
		return err
	}
	defer nc.Close()
	if cfg.JS, err = n.JetStream(nc); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	b, err := bridge.New(cfg)
	if err != nil {
		return err
	}
	srv, err := ops.New(listen, reg)
	if err != nil {
		return err
	}
	srv.AddReady(b.Ready)
	fmt.Fprintf(stdout, "bridge: tenant %q of %s to %s (metrics http://%s/metrics)\n", cfg.Tenant, n.URL, cfg.Destination, srv.Addr())
	return ops.Run(ctx, b, srv.Serving(drain))
}

// bridgeToken returns how the bridge gets its destination token: minted
// from the destination all-in-one's development secret, read from a file
// at every post (so it can be rotated), or FABRIC_BRIDGE_TOKEN.
func bridgeToken(errs *config.Errs, tenant, toTenant, file, toData string) func(context.Context) (string, error) {
	if toTenant == "" {
		toTenant = tenant
	}
	switch {
	case toData != "" && file != "":
		errs.Addf("-to-data and -token-file exclude each other: choose one")
	case toData != "":
		if _, err := allinone.DevToken(toData, toTenant, auth.ScopeIngest, bridgeTokenTTL); err != nil {
			errs.Addf("-to-data: %v", err)
		}
		var (
			mu     sync.Mutex
			token  string
			minted time.Time
		)
		return func(context.Context) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			if time.Since(minted) > bridgeTokenTTL/2 {
				t, err := allinone.DevToken(toData, toTenant, auth.ScopeIngest, bridgeTokenTTL)
				if err != nil {
					return "", err
				}
				token, minted = t, time.Now()
			}
			return token, nil
		}
	case file != "":
		if _, err := os.Stat(file); err != nil {
			errs.Addf("-token-file: %v", err)
		}
		return func(context.Context) (string, error) {
			b, err := os.ReadFile(file)
			if err != nil {
				return "", fmt.Errorf("-token-file: %w", err)
			}
			return strings.TrimSpace(string(b)), nil
		}
	case os.Getenv("FABRIC_BRIDGE_TOKEN") != "":
		token := os.Getenv("FABRIC_BRIDGE_TOKEN")
		return func(context.Context) (string, error) { return token, nil }
	default:
		errs.Addf("no destination token: give -token-file, FABRIC_BRIDGE_TOKEN or -to-data")
	}
	return nil
}
