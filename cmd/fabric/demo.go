package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/config"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// runDemo plays remote MLS members into a running fabric. Without tokens it
// mints development tokens from the secret an all-in-one fabric keeps in its
// data folder.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		api   demo.API
		data  string
		pause time.Duration
		watch bool

		lastEvent atomic.Int64 // unix nanoseconds of the last event printed
		errs      config.Errs
	)
	fs := flag.NewFlagSet("fabric demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config.String(fs, &api.BaseURL, "url", "http://127.0.0.1:8080", "the fabric's HTTP API")
	config.String(fs, &api.Tenant, "tenant", allinone.DevTenant, "tenant to play into")
	config.String(fs, &data, "data", "fabric-data", "the all-in-one data folder, to mint development tokens")
	config.Duration(fs, &errs, &pause, "pause", 500*time.Millisecond, "pause between steps")
	config.Bool(fs, &errs, &watch, "watch", true, "subscribe to the hosted client's events and print them")
	if err := config.Parse(fs, args); err != nil {
		return err
	}
	api.AdminToken = os.Getenv("FABRIC_ADMIN_TOKEN")
	api.IngestToken = os.Getenv("FABRIC_INGEST_TOKEN")
	if api.AdminToken == "" || api.IngestToken == "" {
		var err error
		if api.AdminToken, err = allinone.DevToken(data, api.Tenant, auth.ScopeAdmin, time.Hour); err != nil {
			errs.Addf("no development secret (is the all-in-one fabric running from this folder?): %v; or set FABRIC_ADMIN_TOKEN and FABRIC_INGEST_TOKEN", err)
		}
		api.IngestToken, _ = allinone.DevToken(data, api.Tenant, auth.ScopeIngest, time.Hour)
	}
	if err := errs.Err(); err != nil {
		return err
	}
	s := demo.Script{API: &api, Out: stdout, Pause: pause}
	hosted, err := s.Register(ctx)
	if err != nil {
		return err
	}
	if watch {
		// Subscribe before playing: events are live only (EVENT-014).
		token, err := allinone.DevToken(data, api.Tenant, auth.ScopeEvents, time.Hour)
		if err != nil {
			return err
		}
		c, err := client.Connect(ctx, wsURL(api.BaseURL), token)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.SubscribeFunc(ctx, hosted.ClientID, schema.EventFilter{Kinds: schema.AllKinds()}, func(_ context.Context, ev schema.ClientEvent) error {
			printEvent(stdout, ev)
			lastEvent.Store(time.Now().UnixNano())
			return nil
		})
		if err != nil {
			return err
		}
	}
	if err := s.Play(ctx, hosted); err != nil {
		return err
	}
	if watch {
		// Let the last events arrive: stop after 2 s without one, 15 s at most.
		lastEvent.Store(time.Now().UnixNano())
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end); {
			if time.Since(time.Unix(0, lastEvent.Load())) > 2*time.Second {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	fmt.Fprintf(stdout, "done; follow the client with: go run ./cmd/fabric tail -client %s\n", hosted.ClientID)
	return nil
}

func wsURL(httpURL string) string {
	return "ws" + strings.TrimPrefix(httpURL, "http") + "/v1/events"
}
