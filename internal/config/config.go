// Package config reads a role's configuration from flags and the environment
// and validates it at start, so a bad URL, a missing secret or a bad duration
// stops the process with a message that says which setting is wrong.
//
// Every flag has an environment variable (FABRIC_ plus the flag name in upper
// case with dashes as underscores) that sets its default. Secrets are read from
// the environment or a file, never from a flag value, so they do not show in a
// process listing.
package config

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/ops"
)

// EnvName is the environment variable that sets flag name's default.
func EnvName(flagName string) string {
	return "FABRIC_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// String registers a string flag whose default comes from the environment.
func String(fs *flag.FlagSet, p *string, name, def, usage string) {
	if v, ok := os.LookupEnv(EnvName(name)); ok {
		def = v
	}
	fs.StringVar(p, name, def, usage+" (env "+EnvName(name)+")")
}

// Int registers an int flag whose default comes from the environment. A
// malformed environment value is reported by Validate through Errs.
func Int(fs *flag.FlagSet, errs *Errs, p *int, name string, def int, usage string) {
	if v, ok := os.LookupEnv(EnvName(name)); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			errs.Addf("%s: %q is not a whole number", EnvName(name), v)
		} else {
			def = n
		}
	}
	fs.IntVar(p, name, def, usage+" (env "+EnvName(name)+")")
}

// Bool registers a bool flag whose default comes from the environment.
func Bool(fs *flag.FlagSet, errs *Errs, p *bool, name string, def bool, usage string) {
	if v, ok := os.LookupEnv(EnvName(name)); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs.Addf("%s: %q is not true or false", EnvName(name), v)
		} else {
			def = b
		}
	}
	fs.BoolVar(p, name, def, usage+" (env "+EnvName(name)+")")
}

// Duration registers a duration flag whose default comes from the environment.
func Duration(fs *flag.FlagSet, errs *Errs, p *time.Duration, name string, def time.Duration, usage string) {
	if v, ok := os.LookupEnv(EnvName(name)); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			errs.Addf("%s: %q is not a duration (like 30s or 5m)", EnvName(name), v)
		} else {
			def = d
		}
	}
	fs.DurationVar(p, name, def, usage+" (env "+EnvName(name)+")")
}

// Var registers a flag.Value whose default comes from the environment.
func Var(fs *flag.FlagSet, errs *Errs, v flag.Value, name, usage string) {
	if s, ok := os.LookupEnv(EnvName(name)); ok {
		if err := v.Set(s); err != nil {
			errs.Addf("%s: %v", EnvName(name), err)
		}
	}
	fs.Var(v, name, usage+" (env "+EnvName(name)+")")
}

// Errs collects configuration problems so that one start reports all of them.
type Errs []string

// Addf records a problem.
func (e *Errs) Addf(format string, args ...any) { *e = append(*e, fmt.Sprintf(format, args...)) }

// Err returns the problems as one error, or nil.
func (e Errs) Err() error {
	if len(e) == 0 {
		return nil
	}
	return errors.New("invalid configuration:\n  " + strings.Join(e, "\n  "))
}

// NATS is how a role reaches its NATS servers.
type NATS struct {
	URL      string // comma-separated server URLs
	User     string
	Password string // from FABRIC_NATS_PASSWORD only
	Creds    string // a NATS credentials file
	// InboxPrefix is the prefix of the connection's reply subjects, so a
	// user's permissions can allow it only its own. Empty with a user is
	// _INBOX_<user>, the prefix deploy/nats/accounts.conf and the
	// all-in-one grant each user.
	InboxPrefix string
	CA          string // PEM file of the CAs that sign the servers' TLS certificates
	Domain      string // JetStream domain of the servers; empty for the local one
	Replicas    int    // stream and bucket replicas the role expects
}

// RegisterFlags registers -nats-url, -nats-user, -nats-creds and -replicas.
func (n *NATS) RegisterFlags(fs *flag.FlagSet, errs *Errs) {
	String(fs, &n.URL, "nats-url", nats.DefaultURL, "NATS server URLs, comma-separated")
	String(fs, &n.User, "nats-user", "", "NATS user name; the password is read from FABRIC_NATS_PASSWORD")
	String(fs, &n.Creds, "nats-creds", "", "NATS credentials file")
	String(fs, &n.InboxPrefix, "nats-inbox-prefix", "", "prefix of reply subjects (default _INBOX, or _INBOX_<user> with -nats-user)")
	String(fs, &n.CA, "nats-ca", "", "PEM file of the CAs that sign the NATS servers' TLS certificates")
	String(fs, &n.Domain, "nats-domain", "", "JetStream domain of the NATS servers (empty: the local domain)")
	Int(fs, errs, &n.Replicas, "replicas", 1, "replicas of the fabric's streams and buckets (3 in production)")
	n.Password = os.Getenv("FABRIC_NATS_PASSWORD")
}

// Validate checks the URLs and the replica count.
func (n NATS) Validate(errs *Errs) {
	for _, raw := range strings.Split(n.URL, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss") {
			errs.Addf("-nats-url: %q is not a nats://, tls://, ws:// or wss:// URL with a host", raw)
			continue
		}
		// Secrets are never flag values: a process listing would show them.
		if u.User != nil {
			errs.Addf("-nats-url: %q carries credentials; use -nats-user and FABRIC_NATS_PASSWORD", u.Redacted())
		}
	}
	if n.Replicas != 1 && n.Replicas != 3 && n.Replicas != 5 {
		errs.Addf("-replicas: %d; use 1, 3 or 5", n.Replicas)
	}
	if n.Domain != "" && strings.ContainsAny(n.Domain, ".*> \t") {
		errs.Addf("-nats-domain: %q is not a single subject token", n.Domain)
	}
	if n.User != "" && n.Password == "" {
		errs.Addf("-nats-user is set but FABRIC_NATS_PASSWORD is empty")
	}
}

// Connect opens a connection named after the role, reconnecting for ever.
func (n NATS) Connect(name string) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1)}
	if n.User != "" {
		opts = append(opts, nats.UserInfo(n.User, n.Password))
	}
	if n.Creds != "" {
		opts = append(opts, nats.UserCredentials(n.Creds))
	}
	switch {
	case n.InboxPrefix != "":
		opts = append(opts, nats.CustomInboxPrefix(n.InboxPrefix))
	case n.User != "":
		opts = append(opts, nats.CustomInboxPrefix("_INBOX_"+n.User))
	}
	if n.CA != "" {
		opts = append(opts, nats.RootCAs(n.CA))
	}
	nc, err := nats.Connect(n.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	return nc, nil
}

// ConnectJetStream opens a connection named after the role, and provisions
// or checks the fabric's streams and buckets with n.Replicas (streams.Ensure:
// what is missing is created, a drifted configuration is an error).
func (n NATS) ConnectJetStream(ctx context.Context, name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := n.Connect(name)
	if err != nil {
		return nil, nil, err
	}
	js, err := n.JetStream(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	if err := streams.Ensure(ctx, js, streams.Config{Replicas: n.Replicas}); err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// JetStream returns nc's JetStream context in n.Domain.
func (n NATS) JetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	if n.Domain != "" {
		return jetstream.NewWithDomain(nc, n.Domain)
	}
	return jetstream.New(nc)
}

// Listen registers -listen, the address of the role's HTTP server.
func Listen(fs *flag.FlagSet, p *string, def string) {
	String(fs, p, "listen", def, "HTTP listen address for the API, /metrics, /healthz and /readyz")
}

// HTTPLimits registers the flags of the HTTP server's connection limits,
// the same for the all-in-one and every role that serves clients.
func HTTPLimits(fs *flag.FlagSet, errs *Errs, l *ops.Limits) {
	Int(fs, errs, &l.MaxConns, "max-conns", 0, "open HTTP connections, WebSockets included (0: the open-file limit less a reserve for NATS and JetStream, -1: none)")
	Int(fs, errs, &l.MaxConnsPerAddr, "max-conns-per-addr", ops.DefaultMaxConnsPerAddr, "open HTTP connections of one remote address (-1: none)")
	Duration(fs, errs, &l.IdleTimeout, "idle-timeout", ops.DefaultIdleTimeout, "how long an idle keep-alive HTTP connection stays open")
}

// ValidateListen checks a host:port address.
func ValidateListen(errs *Errs, addr string) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		errs.Addf("-listen: %q is not host:port", addr)
	}
}

// Secret reads a secret from the environment variable env or, when file is
// set, from that file. It is an error when required and neither is set.
func Secret(errs *Errs, env, file string, minLen int) []byte {
	var v []byte
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			errs.Addf("read secret file for %s: %v", env, err)
			return nil
		}
		v = []byte(strings.TrimSpace(string(b)))
	default:
		v = []byte(os.Getenv(env))
	}
	if len(v) == 0 {
		errs.Addf("%s is not set", env)
		return nil
	}
	if len(v) < minLen {
		errs.Addf("%s has %d bytes; it needs at least %d", env, len(v), minLen)
		return nil
	}
	return v
}

// MasterKey reads the 32-byte master key that seals private key material at
// rest, as 64 hexadecimal digits, from FABRIC_MASTER_KEY or a file.
func MasterKey(errs *Errs, file string) []byte {
	raw := Secret(errs, "FABRIC_MASTER_KEY", file, 1)
	if raw == nil {
		return nil
	}
	key, err := hex.DecodeString(string(raw))
	if err != nil || len(key) != 32 {
		errs.Addf("FABRIC_MASTER_KEY must be 64 hexadecimal digits (32 bytes)")
		return nil
	}
	return key
}

// ErrReported marks a command line the flag set has already reported, with
// its usage, on its output: the caller exits with status 2 and prints
// nothing more, so the error shows once.
var ErrReported = errors.New("config: command line already reported")

// Parse parses args with fs. -h and -help return flag.ErrHelp after the
// usage is printed. A bad flag, or an argument where none is taken, is
// reported on fs's output and returned wrapped in ErrReported.
func Parse(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return err
	case err != nil:
		return fmt.Errorf("%w: %w", ErrReported, err)
	case fs.NArg() > 0:
		fmt.Fprintf(fs.Output(), "unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return fmt.Errorf("%w: unexpected argument", ErrReported)
	}
	return nil
}
