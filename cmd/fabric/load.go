package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/config"
	"github.com/fabric-mls/fabric/internal/load"
)

// runLoad starts an all-in-one fabric as a child process (this binary's
// run command, in a fresh data folder), drives a workload through it and
// prints what it measured.
func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		w    load.Workload
		errs config.Errs
	)
	fs := flag.NewFlagSet("fabric load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config.Int(fs, &errs, &w.Tenants, "tenants", 2, "tenants")
	config.Int(fs, &errs, &w.Groups, "groups", 10, "groups per tenant")
	config.Int(fs, &errs, &w.Members, "members", 5, "hosted clients per group, each with its own WebSocket subscriber")
	var rate int
	config.Int(fs, &errs, &rate, "rate", 100, "application messages per second offered in total")
	config.Duration(fs, &errs, &w.Duration, "duration", 30*time.Second, "how long messages are sent")
	config.Duration(fs, &errs, &w.Drain, "drain", 15*time.Second, "how long to wait for events after the last one arrived")
	if err := config.Parse(fs, args); err != nil {
		return err
	}
	w.Rate = float64(rate)
	if err := w.Validate(); err != nil {
		errs.Addf("%v", err)
	}
	if err := errs.Err(); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	data, err := os.MkdirTemp("", "fabric-load-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(data)
	listen, err := freeAddr()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self, "run", "-data", data, "-listen", listen, "-nats-listen", "127.0.0.1:0")
	cmd.Stderr = io.Discard
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("load: start the all-in-one: %w", err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	url, err := httpURL(out)
	if err != nil {
		return err
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	if err := waitReady(ctx, url+"/readyz"); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "all-in-one (pid %d) ready at %s\n", cmd.Process.Pid, url)
	t := load.Target{
		URL:       url,
		EventsURL: wsURL(url),
		Tokens: func(tenant string) (load.Tokens, error) {
			var tok load.Tokens
			var err error
			for _, s := range []struct {
				to    *string
				scope auth.Scope
			}{{&tok.Admin, auth.ScopeAdmin}, {&tok.Ingest, auth.ScopeIngest}, {&tok.Events, auth.ScopeEvents}} {
				if *s.to, err = allinone.DevToken(data, tenant, s.scope, time.Hour); err != nil {
					return tok, err
				}
			}
			return tok, nil
		},
		Processes: []load.Process{{Role: "all-in-one", PID: cmd.Process.Pid}, {Role: "load driver", PID: 0}},
	}
	r, err := load.Run(ctx, w, t, stderr)
	if err != nil {
		return err
	}
	r.Print(stdout)
	return nil
}

// httpURL reads the all-in-one's start lines up to its HTTP API's address.
func httpURL(out io.Reader) (string, error) {
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "HTTP API"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", errors.New("load: the all-in-one exited before it printed its HTTP address")
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// waitReady polls the readiness endpoint for up to a minute.
func waitReady(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("load: %s not ready: %w", url, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
