package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/config"
	"github.com/fabric-mls/fabric/internal/streams"
)

// provision creates the fabric's streams and buckets on a NATS deployment,
// or reports how existing ones differ from what the fabric expects.
func provision(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		n    config.NATS
		errs config.Errs
	)
	fs := flag.NewFlagSet("fabric provision", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n.RegisterFlags(fs, &errs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	n.Validate(&errs)
	if err := errs.Err(); err != nil {
		return err
	}
	nc, err := n.Connect("fabric provision")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if err := streams.Ensure(ctx, js, streams.Config{Replicas: n.Replicas}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "streams and buckets are provisioned with %d replica(s)\n", n.Replicas)
	return nil
}
