// Command fabric runs the whole fabric in one process and carries the tools
// around it.
//
//	fabric [run]     embedded NATS + ingest + converge + fanout; no flags needed
//	fabric provision create or check the streams and buckets on a NATS server
//	fabric demo      play remote MLS members into a running fabric
//	fabric tail      subscribe to a client's events and print them
//	fabric load      drive a whole-system workload through a fresh fabric
//	fabric bridge    forward one fabric's outbound stream to another fabric
//	fabric token     mint a bearer token the roles accept
//	fabric help      the commands, or one command's flags
//
// Each subcommand takes -h. Every flag has a FABRIC_ environment variable.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/fabric-mls/fabric/internal/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, config.ErrReported):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "fabric:", err)
		os.Exit(1)
	}
}

// commands are the subcommands, in the order the usage lists them.
var commands = []struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}{
	{"run", "embedded NATS + ingest + converge + fanout in one process (the default; no flags needed)", runAllInOne},
	{"provision", "create or check the streams and buckets on a NATS server", provision},
	{"demo", "play remote MLS members into a running fabric and print the events", runDemo},
	{"tail", "follow one client's events as they arrive", tail},
	{"load", "start a fresh fabric (the all-in-one, or -cluster: the three roles on three NATS nodes) and drive a whole-system workload through it", runLoad},
	{"bridge", "forward one tenant's outbound stream to another fabric's transport endpoint, so two fabrics hold one conversation", runBridge},
	{"token", "mint a bearer token the roles accept (a deployment's first admin token) from their secret or a tenant's key", token},
	{"help", "this list, or a command's flags: fabric help <command>", nil},
}

// usage lists the subcommands, one line each.
func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: fabric [command] [flags]")
	fmt.Fprintln(w, "\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nEach command takes -h for its flags. Every flag has a FABRIC_ environment variable.")
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	name := "run"
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help":
			usage(stdout)
			return flag.ErrHelp
		case "help":
			if len(args) == 1 {
				usage(stdout)
				return flag.ErrHelp
			}
			args = []string{args[1], "-h"}
		}
		if a := args[0]; a != "" && a[0] != '-' {
			name, args = a, args[1:]
		}
	}
	for _, c := range commands {
		if c.name == name && c.run != nil {
			return c.run(ctx, args, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "fabric: unknown command %q\n\n", name)
	usage(stderr)
	return fmt.Errorf("%w: unknown command", config.ErrReported)
}
