package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/config"
	"github.com/fabric-mls/fabric/internal/load"
	"github.com/fabric-mls/fabric/internal/natsserver"
)

// runLoad starts a fresh fabric, an all-in-one child process (this
// binary's run command) or with -cluster the three roles on a three-node
// NATS cluster, drives a workload through it and prints what it measured.
func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var (
		w    load.Workload
		errs config.Errs
	)
	fs := flag.NewFlagSet("fabric load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config.Int(fs, &errs, &w.Tenants, "tenants", 2, "tenants")
	config.Int(fs, &errs, &w.Groups, "groups", 10, "groups per tenant")
	config.Int(fs, &errs, &w.Members, "members", 5, "hosted clients per group, each with a WebSocket subscription")
	config.Int(fs, &errs, &w.ClientsPerConn, "clients-per-conn", 1, "hosted clients' subscriptions per WebSocket, as an app backend multiplexing its users would")
	var rate int
	config.Int(fs, &errs, &rate, "rate", 100, "application messages per second offered in total")
	config.Duration(fs, &errs, &w.Duration, "duration", 30*time.Second, "how long messages are sent")
	config.Duration(fs, &errs, &w.Drain, "drain", 15*time.Second, "how long to wait for events after the last one arrived")
	var cluster bool
	config.Bool(fs, &errs, &cluster, "cluster", false, "instead of the all-in-one: a three-node NATS cluster (in this process) and ingest, converge and fanout as processes, the binaries beside this one")
	if err := config.Parse(fs, args); err != nil {
		return err
	}
	w.Rate = float64(rate)
	if w.ClientsPerConn < 1 {
		errs.Addf("-clients-per-conn: %d; it must be at least 1", w.ClientsPerConn)
	}
	if err := w.Validate(); err != nil {
		errs.Addf("%v", err)
	}
	if err := errs.Err(); err != nil {
		return err
	}
	data, err := os.MkdirTemp("", "fabric-load-")
	if err != nil {
		return err
	}
	// The processes' logs stay in data when the run fails.
	defer func() {
		if err != nil {
			fmt.Fprintf(stderr, "the processes' logs are in %s\n", data)
			return
		}
		os.RemoveAll(data)
	}()
	start := startAllInOne
	if cluster {
		start = startRoles
	}
	t, stop, err := start(ctx, data, stderr)
	if err != nil {
		return err
	}
	defer stop()
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

// startAllInOne starts this binary's run command in data and returns it as
// the load's target.
func startAllInOne(ctx context.Context, data string, log io.Writer) (load.Target, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return load.Target{}, nil, err
	}
	listen, err := freeAddr()
	if err != nil {
		return load.Target{}, nil, err
	}
	// Every subscriber's WebSocket comes from the driver's one address:
	// the bound per remote address would refuse the 1,025th.
	cmd, out, err := startProcess(ctx, data, self, nil, "run", "-data", data, "-listen", listen, "-nats-listen", "127.0.0.1:0", "-max-conns-per-addr", "-1")
	if err != nil {
		return load.Target{}, nil, err
	}
	stop := func() { stopProcess(cmd) }
	url, err := httpURL(out)
	if err != nil {
		stop()
		return load.Target{}, nil, err
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	if err := waitReady(ctx, url+"/readyz"); err != nil {
		stop()
		return load.Target{}, nil, err
	}
	fmt.Fprintf(log, "all-in-one (pid %d) ready at %s\n", cmd.Process.Pid, url)
	return load.Target{
		URL:       url,
		EventsURL: wsURL(url),
		Tokens: func(tenant string) (load.Tokens, error) {
			return tokens(tenant, func(tenant string, s auth.Scope) (string, error) {
				return allinone.DevToken(data, tenant, s, time.Hour)
			})
		},
		Processes: []load.Process{{Role: "all-in-one", PID: cmd.Process.Pid}, {Role: "load driver", PID: 0}},
	}, stop, nil
}

// startRoles starts a three-node NATS cluster in this process and ingest,
// converge and fanout as processes on it, with replicated streams.
func startRoles(ctx context.Context, data string, log io.Writer) (load.Target, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return load.Target{}, nil, err
	}
	c, err := natsserver.StartCluster(ctx, 3, filepath.Join(data, "nats"))
	if err != nil {
		return load.Target{}, nil, err
	}
	var cmds []*exec.Cmd
	stop := func() {
		for _, cmd := range slices.Backward(cmds) {
			stopProcess(cmd)
		}
		c.Shutdown()
	}
	secret := make([]byte, auth.MinSecretLen)
	key := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		stop()
		return load.Target{}, nil, err
	}
	if _, err := rand.Read(key); err != nil {
		stop()
		return load.Target{}, nil, err
	}
	env := []string{
		"FABRIC_NATS_URL=" + c.ClientURLs(),
		"FABRIC_REPLICAS=3",
		"FABRIC_JWT_SECRET=" + hex.EncodeToString(secret),
		"FABRIC_MASTER_KEY=" + hex.EncodeToString(key),
	}
	t := load.Target{Tokens: func(tenant string) (load.Tokens, error) {
		return tokens(tenant, func(tenant string, s auth.Scope) (string, error) {
			return auth.Mint([]byte(hex.EncodeToString(secret)), auth.Claims{Tenant: tenant, Scopes: []auth.Scope{s}, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
		})
	}}
	for _, role := range []string{"ingest", "converge", "fanout"} {
		listen, err := freeAddr()
		if err != nil {
			stop()
			return load.Target{}, nil, err
		}
		args := []string{"-listen", listen}
		if role == "converge" {
			args = append(args, "-worker-id", "load")
		} else {
			// Every subscriber and request comes from this one address.
			args = append(args, "-max-conns-per-addr", "-1")
		}
		cmd, out, err := startProcess(ctx, data, filepath.Join(filepath.Dir(self), role), env, args...)
		if err != nil {
			stop()
			return load.Target{}, nil, fmt.Errorf("load: %s (built beside fabric with go build -o DIR/ ./cmd/...): %w", role, err)
		}
		cmds = append(cmds, cmd)
		go func() { _, _ = io.Copy(io.Discard, out) }()
		url := "http://" + listen
		if err := waitReady(ctx, url+"/readyz"); err != nil {
			stop()
			return load.Target{}, nil, err
		}
		fmt.Fprintf(log, "%s (pid %d) ready at %s\n", role, cmd.Process.Pid, url)
		t.Processes = append(t.Processes, load.Process{Role: role, PID: cmd.Process.Pid})
		switch role {
		case "ingest":
			t.URL = url
		case "fanout":
			t.EventsURL = wsURL(url)
		}
	}
	t.Processes = append(t.Processes, load.Process{Role: "3 NATS nodes + driver", PID: 0})
	return t, stop, nil
}

// tokens mints a tenant's admin, ingest and events tokens.
func tokens(tenant string, mint func(string, auth.Scope) (string, error)) (load.Tokens, error) {
	var tok load.Tokens
	var err error
	for _, s := range []struct {
		to    *string
		scope auth.Scope
	}{{&tok.Admin, auth.ScopeAdmin}, {&tok.Ingest, auth.ScopeIngest}, {&tok.Events, auth.ScopeEvents}} {
		if *s.to, err = mint(tenant, s.scope); err != nil {
			return tok, err
		}
	}
	return tok, nil
}

// startProcess starts bin with env added to this process's and returns its
// standard output; its standard error (its log) goes to <name>.log in dir.
func startProcess(ctx context.Context, dir, bin string, env []string, args ...string) (*exec.Cmd, io.Reader, error) {
	logFile, err := os.Create(filepath.Join(dir, filepath.Base(bin)+".log"))
	if err != nil {
		return nil, nil, err
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logFile
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("load: start %s: %w", filepath.Base(bin), err)
	}
	return cmd, out, nil
}

// stopProcess sends SIGTERM and waits for the process.
func stopProcess(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
}
