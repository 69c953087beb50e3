// Package ops runs a role's HTTP server: its API routes beside /metrics,
// /healthz and /readyz, and a graceful drain when the process is told to stop.
package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadyFunc reports whether the role can serve; a non-nil error makes /readyz
// answer 503 with the error's text.
type ReadyFunc func(context.Context) error

// Server is a role's HTTP server.
type Server struct {
	mux      *http.ServeMux
	registry *prometheus.Registry
	ready    []ReadyFunc
	srv      *http.Server
	ln       net.Listener
}

// NewRegistry returns a registry with the Go and process collectors, the one
// every role registers its own metrics on.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// New returns a server listening on addr (":0" picks a port) that serves
// registry on /metrics, with the default Limits.
func New(addr string, registry *prometheus.Registry) (*Server, error) {
	return NewWithLimits(addr, registry, Limits{})
}

// NewWithLimits is New with connection limits. Connections refused by them
// are counted in fabric_http_connections_refused_total{reason}.
func NewWithLimits(addr string, registry *prometheus.Registry, limits Limits) (*Server, error) {
	limits = limits.withDefaults()
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fabric_http_connections_refused_total",
		Help: "HTTP connections closed at accept: reason total (the process's bound) or per_address.",
	}, []string{"reason"})
	if err := registry.Register(refused); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
		refused = are.ExistingCollector.(*prometheus.CounterVec)
	}
	for _, r := range []string{"total", "per_address"} {
		refused.WithLabelValues(r) // at zero from the start
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	s := &Server{mux: http.NewServeMux(), registry: registry, ln: newLimitListener(ln, limits, refused)}
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	s.mux.HandleFunc("GET /readyz", s.serveReady)
	s.srv = &http.Server{Handler: s.mux, ReadHeaderTimeout: limits.ReadHeaderTimeout, IdleTimeout: limits.IdleTimeout}
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Handle mounts an API route; pattern is a net/http ServeMux pattern.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// AddReady adds a readiness check. Call it before Serve.
func (s *Server) AddReady(f ReadyFunc) { s.ready = append(s.ready, f) }

func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	for _, f := range s.ready {
		if err := f(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	_, _ = w.Write([]byte("ready\n"))
}

// Serve serves until ctx ends, then stops accepting, lets in-flight requests
// finish for up to drain, and returns.
func (s *Server) Serve(ctx context.Context, drain time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		slog.Error("http server", "err", serr)
	}
	if err != nil {
		return fmt.Errorf("drain http server: %w", err)
	}
	return nil
}
