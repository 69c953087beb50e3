// Command fabric runs the whole fabric in one process and carries the tools
// around it.
//
//	fabric [run]     embedded NATS + ingest + converge + fanout; no flags needed
//	fabric provision create or check the streams and buckets on a NATS server
//	fabric demo      play remote MLS members into a running fabric
//	fabric tail      subscribe to a client's events and print them
//
// Each subcommand takes -h. Every flag has a FABRIC_ environment variable.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fabric:", err)
		os.Exit(1)
	}
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "run"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	switch cmd {
	case "run":
		return runAllInOne(ctx, args, stdout, stderr, log)
	case "provision":
		return provision(ctx, args, stdout, stderr)
	case "demo":
		return runDemo(ctx, args, stdout, stderr)
	case "tail":
		return tail(ctx, args, stdout, stderr)
	default:
		return fmt.Errorf("unknown command %q; want run, provision, demo or tail", cmd)
	}
}
