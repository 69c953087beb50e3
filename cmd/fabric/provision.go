package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/fabric-mls/fabric/internal/config"
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
	if err := config.Parse(fs, args); err != nil {
		return err
	}
	n.Validate(&errs)
	if err := errs.Err(); err != nil {
		return err
	}
	nc, _, err := n.ConnectJetStream(ctx, "fabric provision")
	if err != nil {
		return err
	}
	nc.Close()
	fmt.Fprintf(stdout, "streams and buckets are provisioned with %d replica(s)\n", n.Replicas)
	return nil
}
