// Package natsserver runs an embedded nats-server with JetStream: one node
// for the all-in-one mode and the tests, or a loopback cluster of several
// nodes for tests of replication and failover.
//
// Every listener binds to loopback unless the caller names another host;
// the package never defaults to all interfaces.
package natsserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// DefaultHost is the interface every listener binds to unless Options.Host
// names another.
const DefaultHost = "127.0.0.1"

// RandomPort asks for a port chosen by the operating system.
const RandomPort = -1

// DefaultMaxAtomicBatch is the atomic batch limit (messages per batch) an
// embedded server allows unless Options.MaxAtomicBatch says otherwise:
// ten times nats-server's default, so converge can commit the events of
// many messages of a large group with one checkpoint (deploy/nats sets the
// same for real servers; converge's -max-batch must not exceed it).
const DefaultMaxAtomicBatch = 10000

// defaultReadyTimeout bounds how long Start waits for the server to accept
// clients when the context has no deadline.
const defaultReadyTimeout = 10 * time.Second

// Options configure one embedded server.
type Options struct {
	// StoreDir is where JetStream keeps its files. Required.
	StoreDir string
	// Host is the client listener's interface; DefaultHost when empty.
	Host string
	// Port is the client listener's port: RandomPort (-1) for a port chosen
	// by the system, 0 for the NATS default 4222.
	Port int
	// InProcess starts the server without any client listener; connect with
	// Server.Connect, which uses an in-process pipe.
	InProcess bool
	// ServerName names the node; nats-server picks one when empty. Nodes of
	// one cluster need distinct names.
	ServerName string
	// MaxMemory and MaxStore cap JetStream's memory and file storage in
	// bytes; 0 lets the server choose.
	MaxMemory int64
	MaxStore  int64
	// MaxAtomicBatch is the most messages one atomic batch publish may
	// hold; DefaultMaxAtomicBatch when 0.
	MaxAtomicBatch int
	// SyncAlways makes the file store fsync every write instead of every
	// SyncInterval, trading throughput for durability across power loss.
	SyncAlways bool
	// SyncInterval is how often the file store fsyncs when SyncAlways is
	// off; 0 is the server's default of two minutes.
	SyncInterval time.Duration
	// Users are the only clients the server accepts, each with its
	// permissions; any client when empty, which Start allows only on a
	// loopback listener.
	Users []*server.User
	// Cluster, when set, makes the node a member of a cluster.
	Cluster *ClusterOptions
	// Domain is the JetStream domain of the server; empty for none.
	Domain string
	// LeafPort, when not 0, opens a leaf node listener on Host
	// (RandomPort for a port chosen by the system).
	LeafPort int
	// LeafRemotes are the leaf node listeners of hubs this server connects
	// to as a leaf node; Start returns once it is connected to them.
	LeafRemotes []*url.URL
	// Logger receives the server's log; nil silences it.
	Logger server.Logger
}

// ClusterOptions make a node part of a cluster of routed servers.
type ClusterOptions struct {
	// Name is the cluster's name, the same on every node.
	Name string
	// Host and Port are the route listener; Host defaults to DefaultHost.
	Host string
	Port int
	// Routes are the route URLs of every node, this one included.
	Routes []*url.URL
}

// Server is a running embedded nats-server. Its methods are safe for
// concurrent use.
type Server struct {
	mu   sync.Mutex
	opts Options
	ns   *server.Server
}

// Start starts a server and waits until it accepts clients and JetStream is
// enabled, or ctx ends.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.StoreDir == "" {
		return nil, errors.New("natsserver: StoreDir is required")
	}
	if opts.Host == "" {
		opts.Host = DefaultHost
	}
	if !opts.InProcess && len(opts.Users) == 0 && !isLoopback(opts.Host) {
		return nil, fmt.Errorf("natsserver: a listener on %s needs users: without them anyone who reaches it may read and write every stream", opts.Host)
	}
	s := &Server{opts: opts}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) start(ctx context.Context) error {
	if s.opts.LeafPort == RandomPort {
		// Fixed before the first start, so remotes find it after a restart.
		p, err := reservePorts(1)
		if err != nil {
			return err
		}
		s.opts.LeafPort = p[0]
	}
	ns, err := server.NewServer(s.serverOptions())
	if err != nil {
		return fmt.Errorf("natsserver: configure: %w", err)
	}
	// The server reports a listener it cannot open (a busy port) only to
	// its logger, so the logger catches it and Start fails at once.
	next := s.opts.Logger
	if next == nil {
		next = SlogLogger(slog.New(slog.DiscardHandler))
	}
	fatal := &fatalCatcher{Logger: next, err: make(chan error, 1)}
	ns.SetLoggerV2(fatal, false, false, false)
	ns.Start()
	if err := waitReady(ctx, ns, fatal.err, len(s.opts.LeafRemotes) > 0); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return err
	}
	// A restart must come back on the same port, so clients find it again.
	if !s.opts.InProcess {
		if addr, ok := ns.Addr().(*net.TCPAddr); ok {
			s.opts.Port = addr.Port
		}
	}
	s.ns = ns
	return nil
}

func (s *Server) serverOptions() *server.Options {
	o := &server.Options{
		ServerName:         s.opts.ServerName,
		Host:               s.opts.Host,
		Port:               s.opts.Port,
		DontListen:         s.opts.InProcess,
		JetStream:          true,
		StoreDir:           s.opts.StoreDir,
		JetStreamMaxMemory: s.opts.MaxMemory,
		JetStreamMaxStore:  s.opts.MaxStore,
		NoLog:              s.opts.Logger == nil,
		NoSigs:             true,
		// The embedded server has no HTTP monitor; the roles serve their own.
		HTTPPort: 0,
		Users:    s.opts.Users,
	}
	if s.opts.SyncAlways {
		o.SyncAlways = true
	}
	if s.opts.SyncInterval > 0 {
		o.SyncInterval = s.opts.SyncInterval
	}
	o.JetStreamLimits.MaxBatchSize = DefaultMaxAtomicBatch
	if s.opts.MaxAtomicBatch > 0 {
		o.JetStreamLimits.MaxBatchSize = s.opts.MaxAtomicBatch
	}
	o.JetStreamDomain = s.opts.Domain
	if s.opts.LeafPort != 0 {
		o.LeafNode.Host = o.Host
		o.LeafNode.Port = s.opts.LeafPort
	}
	if len(s.opts.LeafRemotes) > 0 {
		o.LeafNode.Remotes = []*server.RemoteLeafOpts{{URLs: s.opts.LeafRemotes}}
	}
	if c := s.opts.Cluster; c != nil {
		host := c.Host
		if host == "" {
			host = DefaultHost
		}
		o.Cluster = server.ClusterOpts{Name: c.Name, Host: host, Port: c.Port}
		o.Routes = c.Routes
	}
	return o
}

// waitReady waits for client readiness and JetStream, and returns at once
// with the server's fatal error (a listener it cannot open). A lone
// server's JetStream is ready when enabled; a clustered one also needs its
// meta layer, which callers of a cluster wait for separately.
func waitReady(ctx context.Context, ns *server.Server, fatal <-chan error, leaf bool) error {
	deadline := time.Now().Add(defaultReadyTimeout)
	if dl, ok := ctx.Deadline(); ok {
		deadline = dl
	}
	for !ns.ReadyForConnections(readyPoll) {
		select {
		case err := <-fatal:
			return err
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("natsserver: server not ready for connections")
		}
	}
	for !ns.JetStreamEnabled() {
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return fmt.Errorf("natsserver: waiting for JetStream: %w", err)
		}
	}
	for leaf && ns.NumLeafNodes() == 0 {
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return fmt.Errorf("natsserver: waiting for the leaf node connection: %w", err)
		}
	}
	return nil
}

// LeafURL is the URL of the leaf node listener, for Options.LeafRemotes
// of a leaf; nil when the server has none.
func (s *Server) LeafURL() *url.URL {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.LeafPort == 0 {
		return nil
	}
	return &url.URL{Scheme: "nats-leaf", Host: net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.LeafPort))}
}

// ClientURL is the URL clients connect to, e.g. nats://127.0.0.1:4222.
// It is empty for an in-process server.
func (s *Server) ClientURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.InProcess {
		return ""
	}
	return "nats://" + net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.Port))
}

// Connect opens a client connection: in-process for an InProcess server,
// over loopback otherwise.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	s.mu.Lock()
	ns, inProcess := s.ns, s.opts.InProcess
	s.mu.Unlock()
	if ns == nil {
		return nil, errors.New("natsserver: server is shut down")
	}
	if inProcess {
		return nats.Connect("", append(opts, nats.InProcessServer(ns))...)
	}
	return nats.Connect(s.ClientURL(), opts...)
}

// SetUsers replaces the server's users, keeping every other option: the
// connections of users it keeps stay, a user it drops is disconnected (a
// configuration reload).
func (s *Server) SetUsers(users []*server.User) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ns == nil {
		return errors.New("natsserver: reload users: the server is shut down")
	}
	s.opts.Users = users
	if err := s.ns.ReloadOptions(s.serverOptions()); err != nil {
		return fmt.Errorf("natsserver: reload users: %w", err)
	}
	return nil
}

// NATS returns the underlying nats-server, nil after Shutdown.
func (s *Server) NATS() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns
}

// Shutdown stops the server and waits until it has stopped. It is a no-op
// on a server that is already shut down.
func (s *Server) Shutdown() {
	s.mu.Lock()
	ns := s.ns
	s.ns = nil
	s.mu.Unlock()
	if ns == nil {
		return
	}
	ns.Shutdown()
	ns.WaitForShutdown()
}

// Restart starts a shut-down server again with the same options, store
// directory and port.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ns != nil {
		return errors.New("natsserver: server is running")
	}
	return s.start(ctx)
}

// Running reports whether the server is started and not shut down.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns != nil && s.ns.Running()
}

// isLoopback reports whether host names only the loopback interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Healthy reports whether the server's JetStream takes writes: a stream
// whose store failed a write (a full disk, too many open files) refuses
// every later write until the server restarts.
func (s *Server) Healthy() error {
	ns := s.NATS()
	if ns == nil {
		return errors.New("natsserver: shut down")
	}
	h := ns.Healthz(nil)
	if h.Status != "ok" {
		return fmt.Errorf("natsserver: %s", h.Error)
	}
	return nil
}

// readyPoll is how long one readiness check waits before waitReady looks
// for a fatal error again.
const readyPoll = 50 * time.Millisecond

// fatalCatcher passes the server's log on and keeps its first fatal error.
// A fatal record goes on as an error: a logger's Fatalf may exit the
// process.
type fatalCatcher struct {
	server.Logger
	err chan error // capacity 1
}

func (c *fatalCatcher) Fatalf(format string, v ...any) {
	select {
	case c.err <- fmt.Errorf("natsserver: "+format, v...):
	default:
	}
	c.Errorf(format, v...)
}

// SlogLogger passes the server's warnings and errors to l; its notices
// become debug records, its debug and trace output is dropped.
func SlogLogger(l *slog.Logger) server.Logger { return slogLogger{l} }

type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Noticef(format string, v ...any) {
	s.l.Debug("nats-server: " + fmt.Sprintf(format, v...))
}
func (s slogLogger) Warnf(format string, v ...any) {
	s.l.Warn("nats-server: " + fmt.Sprintf(format, v...))
}
func (s slogLogger) Fatalf(format string, v ...any) {
	s.l.Error("nats-server: " + fmt.Sprintf(format, v...))
}
func (s slogLogger) Errorf(format string, v ...any) {
	s.l.Error("nats-server: " + fmt.Sprintf(format, v...))
}
func (s slogLogger) Debugf(string, ...any) {}
func (s slogLogger) Tracef(string, ...any) {}
