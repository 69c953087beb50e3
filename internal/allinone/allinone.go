// Package allinone runs the whole fabric in one process: an embedded
// nats-server with JetStream, ingest with the client stores and signals,
// converge and the fanout gateway, behind one HTTP listener. It is the
// laptop, demo and test shape of the fabric; production runs the roles as
// separate processes against a NATS cluster.
package allinone

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bridge"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/clientapi"
	"github.com/fabric-mls/fabric/internal/console"
	"github.com/fabric-mls/fabric/internal/converge"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/fanout"
	"github.com/fabric-mls/fabric/internal/ingest"
	"github.com/fabric-mls/fabric/internal/natsserver"
	"github.com/fabric-mls/fabric/internal/ops"
	"github.com/fabric-mls/fabric/internal/quota"
)

// DevTenant is the tenant the development tokens name.
const DevTenant = "dev"

// Options configure an all-in-one fabric. The zero value of every member
// but DataDir is a working default.
type Options struct {
	// DataDir holds JetStream's files and, in development mode, the
	// generated secrets. Required.
	DataDir string
	// Listen is the HTTP address of every API, /metrics, /healthz and
	// /readyz; 127.0.0.1:8080 when empty.
	Listen string
	// NATSListen is the embedded server's client address, so that the
	// standalone roles and the NATS tools can join; 127.0.0.1:4222 when
	// empty, "127.0.0.1:0" for a free port.
	NATSListen string
	// OperatorUsers are NATS users beside the roles', with the
	// permissions given (nil: every subject): an operator's own tools,
	// such as a backup mirror of a stream, which no role may make.
	OperatorUsers []*server.User
	// JWTSecret signs and verifies bearer tokens. In development mode it
	// is generated into DataDir when empty.
	JWTSecret []byte
	// TokenLifetimes overrides auth.DefaultLifetimes per scope.
	TokenLifetimes auth.Lifetimes
	// TenantKeys verify the EdDSA and ES256 tokens of each tenant
	// (auth.WithTenantKeys); JWKSTTL and JWKSMinRefetch set their JWKS
	// cache (auth.WithJWKS, the defaults when zero).
	TenantKeys     map[string]auth.TenantKeys
	JWKSTTL        time.Duration
	JWKSMinRefetch time.Duration
	// MasterKey seals private key material at rest (32 bytes). In
	// development mode it is generated into DataDir when empty.
	MasterKey []byte
	// OriginPatterns are the browser origins allowed to open a WebSocket
	// besides the fabric's own host (fanout.Config.OriginPatterns).
	OriginPatterns []string
	// SSEQueryToken accepts SSE's access_token query parameter in
	// production too; in development it is always accepted.
	SSEQueryToken bool
	// Production refuses to generate secrets: JWTSecret and MasterKey must
	// be given.
	Production bool
	// SyncInterval is how often JetStream fsyncs its files. Zero, the
	// default, fsyncs every write before it is acknowledged, so an input
	// answered queued survives power loss; a positive interval trades that
	// for speed (what is written in the last interval may be lost).
	SyncInterval time.Duration
	// ConvergeNow is converge's clock (converge.Config.Now), time.Now when
	// nil: tests of disappearing messages (META-063) hold it.
	ConvergeNow func() time.Time
	// KeyPackagePool is converge's KeyPackage pool size
	// (converge.Config.KeyPackagePool): clientstore.DefaultKeyPackagePool
	// when zero.
	KeyPackagePool int
	// SelfUpdateAfter is converge's self-update schedule
	// (converge.Config.SelfUpdateAfter): 0, off, when zero.
	SelfUpdateAfter time.Duration
	// Quotas bound each tenant's operations and reads (docs/limits.md);
	// zero fields take defaults. Quotas.Operations.InputBytes is set from
	// TenantInputBytes.
	Quotas clientapi.Quotas
	// TenantInputBytes bounds the bytes one tenant stores on FABRIC_IN
	// within its MaxAge, intake and operations together:
	// streams.DefaultTenantInputBytes when 0, none when negative.
	TenantInputBytes int64
	// HTTPLimits bound the HTTP connections (idle timeout, a total and a
	// per-address bound); the total defaults to the descriptor limit less
	// a reserve for NATS and JetStream's files.
	HTTPLimits ops.Limits
	// Logger receives diagnostics, the embedded server's warnings and
	// errors among them; slog.Default when nil.
	Logger *slog.Logger
}

// healthInterval is how often the fabric checks that JetStream still takes
// writes; a store that failed a write refuses every later one, so after
// unhealthyChecks failed checks in a row the fabric stops with an error and
// its supervisor restarts it.
const (
	healthInterval  = 5 * time.Second
	unhealthyChecks = 3
)

// Fabric is a running all-in-one fabric.
type Fabric struct {
	URL     string // base URL of the HTTP API, like http://127.0.0.1:8080
	NATSURL string // client URL of the embedded nats-server

	opts          Options
	secret        []byte
	ns            *natsserver.Server
	nc            *nats.Conn // admin: provisions the streams
	natsPasswords map[string]string
	roleUsers     []*server.User // the roles' NATS users and the operator's
	// tenantPasswords are the tenant users loaded, by user (tenantuser.go);
	// only watchTenantUsers changes them after Start.
	tenantPasswords map[string]string
	roleConns       []*nats.Conn
	lock            *os.File // the data directory's lock, held while running
	cancel          context.CancelFunc
	stopped         chan struct{} // closed when every component has returned
	err             error         // why, set before stopped closes
}

// Start starts every part and returns when the fabric serves.
func Start(ctx context.Context, o Options) (_ *Fabric, err error) {
	if o.DataDir == "" {
		return nil, errors.New("allinone: DataDir is required")
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:8080"
	}
	if o.NATSListen == "" {
		o.NATSListen = "127.0.0.1:4222"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if n, err := ops.RaiseFileLimit(); err != nil {
		o.Logger.Warn("raising the open-file limit", "err", err)
	} else {
		o.Logger.Debug("open-file limit", "limit", n)
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("allinone: data dir: %w", err)
	}
	f := &Fabric{stopped: make(chan struct{})}
	defer func() {
		if err != nil {
			f.abort()
		}
	}()
	// Before anything in the directory is read or written.
	if f.lock, err = lockDataDir(o.DataDir); err != nil {
		return nil, err
	}
	if o.JWTSecret, err = secret(o, "jwt-secret", o.JWTSecret, auth.MinSecretLen); err != nil {
		return nil, err
	}
	if o.MasterKey, err = secret(o, "master-key", o.MasterKey, 32); err != nil {
		return nil, err
	}
	if len(o.MasterKey) != 32 {
		return nil, fmt.Errorf("allinone: the master key has %d bytes, want 32", len(o.MasterKey))
	}
	f.opts, f.secret = o, o.JWTSecret
	host, port, err := splitHostPort(o.NATSListen)
	if err != nil {
		return nil, err
	}
	users, passwords, err := natsCredentials(o.DataDir)
	if err != nil {
		return nil, err
	}
	users = append(users, o.OperatorUsers...)
	f.natsPasswords, f.roleUsers = passwords, users
	if f.tenantPasswords, err = tenantPasswords(o.DataDir); err != nil {
		return nil, err
	}
	if users, err = f.withTenantUsers(f.tenantPasswords); err != nil {
		return nil, err
	}
	f.ns, err = natsserver.Start(ctx, natsserver.Options{Users: users,
		StoreDir: filepath.Join(o.DataDir, "jetstream"), Host: host, Port: port, ServerName: "fabric",
		SyncAlways: o.SyncInterval <= 0, SyncInterval: o.SyncInterval, Logger: natsserver.SlogLogger(o.Logger),
	})
	if err != nil {
		return nil, fmt.Errorf("allinone: embedded NATS on %s: %w", o.NATSListen, err)
	}
	f.NATSURL = f.ns.ClientURL()
	if f.nc, err = f.connectAs(UserAdmin); err != nil {
		return nil, err
	}
	conns := map[string]*nats.Conn{}
	jss := map[string]jetstream.JetStream{}
	for _, u := range []string{UserIngest, UserAPI, UserConverge, UserFanout} {
		nc, err := f.connectAs(u)
		if err != nil {
			return nil, err
		}
		f.roleConns = append(f.roleConns, nc)
		conns[u] = nc
		if jss[u], err = jetstream.New(nc); err != nil {
			return nil, fmt.Errorf("allinone: jetstream: %w", err)
		}
	}
	js, err := jetstream.New(f.nc)
	if err != nil {
		return nil, fmt.Errorf("allinone: jetstream: %w", err)
	}
	if err := streams.Ensure(ctx, js, streams.Config{Replicas: 1}); err != nil {
		return nil, err
	}
	verifier, err := auth.NewVerifier(o.JWTSecret, auth.WithMaxLifetimes(o.TokenLifetimes),
		auth.WithTenantKeys(o.TenantKeys), auth.WithJWKS(o.JWKSTTL, o.JWKSMinRefetch, nil))
	if err != nil {
		return nil, err
	}
	vault, err := engine.NewVault(o.MasterKey)
	if err != nil {
		return nil, err
	}
	reg := ops.NewRegistry()
	if o.TenantInputBytes == 0 {
		o.TenantInputBytes = streams.DefaultTenantInputBytes
	}
	var tenantInput *quota.Tally
	if o.TenantInputBytes > 0 {
		window, err := streams.InputMaxAge(ctx, js)
		if err != nil {
			return nil, err
		}
		tenantInput = quota.NewTally(o.TenantInputBytes, window)
	}
	o.Quotas.Operations.InputBytes = tenantInput

	// The same components as cmd/ingest, cmd/converge and cmd/fanout,
	// built and composed the same way (docs/architecture.md, Lifecycle).
	ing, err := ingest.New(ingest.Config{Conn: conns[UserIngest], Verifier: verifier, Vault: vault, InputBytes: tenantInput, NATSIntake: true, NATSRequireToken: true, DrainTimeout: drainTimeout, Logger: o.Logger, Registerer: reg})
	if err != nil {
		return nil, err
	}
	api, err := clientapi.New(ctx, clientapi.Config{JS: jss[UserAPI], Vault: vault, Verifier: verifier, OriginPatterns: o.OriginPatterns, Logger: o.Logger, Registerer: reg, Quotas: o.Quotas})
	if err != nil {
		return nil, err
	}
	conv, err := converge.New(ctx, converge.Config{JS: jss[UserConverge], MLS: converge.EngineMLS{Vault: vault}, WorkerID: "allinone", MaxBatch: natsserver.DefaultMaxAtomicBatch, KeyPackagePool: o.KeyPackagePool, SelfUpdateAfter: o.SelfUpdateAfter, Metrics: converge.NewMetrics(reg), Logger: o.Logger, Now: o.ConvergeNow})
	if err != nil {
		return nil, err
	}
	gw, err := fanout.New(fanout.Config{NATS: conns[UserFanout], JetStream: jss[UserFanout], Verifier: verifier, TokenSecret: o.JWTSecret,
		AllowQueryToken: o.SSEQueryToken || !o.Production, OriginPatterns: o.OriginPatterns, DMKeys: &fanout.KVDMKeys{JetStream: jss[UserFanout], Timeout: 2 * time.Second}, Registry: reg, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	srv, err := ops.NewWithLimits(o.Listen, reg, o.HTTPLimits)
	if err != nil {
		_ = gw.Shutdown(ctx) // it holds no connection yet
		return nil, fmt.Errorf("allinone: HTTP %w", err)
	}
	ing.Mount(srv)
	api.Mount(srv)
	gw.Mount(srv)
	srv.Handle(console.Route, console.Handler())
	srv.AddReady(func(context.Context) error { return f.ns.Healthy() })
	srv.AddReady(func(context.Context) error { return ing.Ready() })
	srv.AddReady(conv.Ready)
	srv.AddReady(gw.Ready)
	f.URL = "http://" + srv.Addr()

	runCtx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go func() {
		f.err = ops.Run(runCtx, ing, api, conv, gw, bridge.NewProvisioner(jss[UserIngest], o.Logger), srv.Serving(drainTimeout), ops.RunFunc(f.watchStore), ops.RunFunc(f.watchTenantUsers))
		close(f.stopped)
	}()
	// The fabric serves once ingest takes input.
	select {
	case <-ing.Started():
		return f, nil
	case <-f.stopped:
		cancel()
		if f.err == nil {
			return nil, errors.New("allinone: stopped before serving")
		}
		return nil, f.err
	case <-ctx.Done():
		cancel()
		<-f.stopped
		return nil, ctx.Err()
	}
}

// drainTimeout bounds each component's drain.
const drainTimeout = 10 * time.Second

// watchStore returns an error when JetStream stops taking writes, which
// only a restart recovers, and nil when ctx ends.
func (f *Fabric) watchStore(ctx context.Context) error {
	t := time.NewTicker(healthInterval)
	defer t.Stop()
	for failed := 0; ; {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		err := f.ns.Healthy()
		if err == nil {
			failed = 0
			continue
		}
		f.opts.Logger.Error("JetStream is unhealthy", "err", err)
		if failed++; failed >= unhealthyChecks {
			return fmt.Errorf("allinone: JetStream takes no writes, restart: %w", err)
		}
	}
}

// Token mints a development token of the dev tenant for every client with
// the given scopes, valid for ttl.
func (f *Fabric) Token(ttl time.Duration, scopes ...auth.Scope) (string, error) {
	return auth.Mint(f.secret, auth.Claims{Tenant: DevTenant, Scopes: scopes, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(ttl)})
}

// DataDir is the fabric's data directory (Options.DataDir): its
// generated secrets and NATS passwords (NATSPasswordFile) are there.
func (f *Fabric) DataDir() string { return f.opts.DataDir }

// Stopped is closed when the fabric has stopped; Err then says why.
func (f *Fabric) Stopped() <-chan struct{} { return f.stopped }

// Err is why the fabric stopped: nil after Shutdown, or the first role's
// error. Read it after Stopped is closed.
func (f *Fabric) Err() error { return f.err }

// Shutdown drains every component at once: the gateway ends
// subscriptions with reason shutdown, ingest finishes in-flight requests,
// converge stops after its current input, the HTTP server lets requests in
// flight finish. Then NATS stops. It returns ctx's error if ctx ends first;
// the drains go on, each bounded.
func (f *Fabric) Shutdown(ctx context.Context) error {
	f.cancel()
	select {
	case <-f.stopped:
	case <-ctx.Done():
		return ctx.Err()
	}
	f.close()
	return f.err
}

// abort undoes a Start that failed before its components ran.
func (f *Fabric) abort() {
	f.close()
}

func (f *Fabric) close() {
	for _, nc := range f.roleConns {
		nc.Close()
	}
	if f.nc != nil {
		f.nc.Close()
	}
	if f.ns != nil {
		f.ns.Shutdown()
	}
	if f.lock != nil {
		f.lock.Close() // releases the flock
	}
}

// secret returns given, or in development mode the secret stored in the data
// directory under name, generating it on first start.
func secret(o Options, name string, given []byte, size int) ([]byte, error) {
	if len(given) > 0 {
		return given, nil
	}
	if o.Production {
		return nil, fmt.Errorf("allinone: production mode needs the %s; set it (see README, Configuration)", name)
	}
	return loadOrGenerate(o.DataDir, name, size)
}

// loadOrGenerate returns the secret stored in dataDir under name,
// generating it on first start.
func loadOrGenerate(dataDir, name string, size int) ([]byte, error) {
	v, err := loadSecret(dataDir, name, size)
	if !errors.Is(err, os.ErrNotExist) {
		return v, err
	}
	v = make([]byte, size)
	if _, err := rand.Read(v); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dataDir, name), []byte(hex.EncodeToString(v)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("allinone: write %s: %w", name, err)
	}
	return v, nil
}

func loadSecret(dataDir, name string, size int) ([]byte, error) {
	path := filepath.Join(dataDir, name)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("allinone: read %s: %w", name, err)
	}
	v, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(v) != size {
		return nil, fmt.Errorf("allinone: %s is not %d bytes of hex; delete it to generate a new one", path, size)
	}
	return v, nil
}

// JWTSecret is the HS256 secret a development fabric generated in dataDir.
func JWTSecret(dataDir string) ([]byte, error) {
	return loadSecret(dataDir, "jwt-secret", auth.MinSecretLen)
}

// DevToken mints a token for tenant with one scope and every client, signed
// with the development secret a fabric generated in dataDir.
func DevToken(dataDir, tenant string, scope auth.Scope, ttl time.Duration) (string, error) {
	secret, err := loadSecret(dataDir, "jwt-secret", auth.MinSecretLen)
	if err != nil {
		return "", err
	}
	return auth.Mint(secret, auth.Claims{Tenant: tenant, Scopes: []auth.Scope{scope}, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(ttl)})
}

func splitHostPort(addr string) (string, int, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", 0, fmt.Errorf("allinone: NATS listen address %q is not host:port", addr)
	}
	var port int
	if _, err := fmt.Sscanf(addr[i+1:], "%d", &port); err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("allinone: NATS listen address %q has no valid port", addr)
	}
	if port == 0 {
		port = -1 // natsserver: a free port
	}
	return addr[:i], port, nil
}
