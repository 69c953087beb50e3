package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/config"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// tail subscribes to one client's events with a filter and prints each as it
// arrives, one line per event; a lagged event says how many were discarded.
// With -since or -from-start it prints the stored events first.
func tail(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		url, tenant, clientID, data, kinds, groups string
		since                                      time.Duration
		fromStart                                  bool
		errs                                       config.Errs
	)
	fs := flag.NewFlagSet("fabric tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config.String(fs, &url, "url", "ws://127.0.0.1:8080/v1/events", "the gateway's WebSocket URL")
	config.String(fs, &tenant, "tenant", allinone.DevTenant, "tenant of the client")
	config.String(fs, &clientID, "client", "", "client id to follow (required)")
	config.String(fs, &data, "data", "fabric-data", "the all-in-one data folder, to mint a development token")
	config.String(fs, &kinds, "kinds", "all", `comma-separated event kinds, or "all" (or empty): every kind`)
	config.String(fs, &groups, "groups", "", "comma-separated group ids (hex); every group when empty")
	config.Duration(fs, &errs, &since, "since", 0, "start with the client's events stored this long ago (e.g. 10m), then follow live ones")
	config.Bool(fs, &errs, &fromStart, "from-start", false, "start with the first of the client's events the stream holds, then follow live ones")
	if err := config.Parse(fs, args); err != nil {
		return err
	}
	if clientID == "" {
		errs.Addf("-client is required")
	}
	var opts []client.SubscribeOption
	switch {
	case since < 0:
		errs.Addf("-since must be positive, e.g. 10m")
	case since > 0 && fromStart:
		errs.Addf("-since and -from-start exclude each other: choose where to start")
	case since > 0:
		opts = append(opts, client.Since(time.Now().Add(-since)))
	case fromStart:
		opts = append(opts, client.FromStart())
	}
	filter, err := parseFilter(kinds, groups)
	if err != nil {
		errs.Addf("%v", err)
	}
	token := os.Getenv("FABRIC_EVENTS_TOKEN")
	if token == "" {
		if token, err = allinone.DevToken(data, tenant, auth.ScopeEvents, 24*time.Hour); err != nil {
			errs.Addf("no development secret: %v; or set FABRIC_EVENTS_TOKEN", err)
		}
	}
	if err := errs.Err(); err != nil {
		return err
	}

	c, err := client.Connect(ctx, url, token)
	if err != nil {
		return err
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, clientID, filter, opts...)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "following client %s; Ctrl-C to stop\n", clientID)
	for ev, err := range sub.Events(ctx) {
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		printEvent(stdout, ev)
	}
	return nil
}

func parseFilter(kinds, groups string) (schema.EventFilter, error) {
	var f schema.EventFilter // no kinds: every kind
	if kinds != "all" && kinds != "" {
		for _, k := range strings.Split(kinds, ",") {
			f.Kinds = append(f.Kinds, schema.EventKind(strings.TrimSpace(k)))
		}
	}
	for _, g := range strings.Split(groups, ",") {
		if g = strings.TrimSpace(g); g == "" {
			continue
		}
		id, err := hex.DecodeString(g)
		if err != nil {
			return f, fmt.Errorf("-groups: %q is not hex", g)
		}
		f.GroupIDs = append(f.GroupIDs, id)
	}
	if err := f.Validate(); err != nil {
		return f, fmt.Errorf("filter: %w", err)
	}
	return f, nil
}

// printEvent writes "time kind payload-json", and a plain warning for lagged.
func printEvent(w io.Writer, ev schema.ClientEvent) {
	now := time.Now().Format("15:04:05.000")
	if ev.Kind == schema.KindLagged && ev.Lagged != nil {
		fmt.Fprintf(w, "%s lagged: %d events were discarded\n", now, ev.Lagged.Discarded)
		return
	}
	b, err := json.Marshal(ev)
	if err != nil {
		fmt.Fprintf(w, "%s %s (unprintable: %v)\n", now, ev.Kind, err)
		return
	}
	fmt.Fprintf(w, "%s %-34s %s\n", now, ev.Kind, b)
}
