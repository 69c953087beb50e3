package ingest

import (
	"net/http"
	"sync"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
)

// Handler serves the ingest API (DESIGN §10):
//
//	POST /v1/tenants/{tenant}/transport
//	GET  /v1/tenants/{tenant}/outcomes/{message_id}
//
// Both need a bearer token with scope ingest for the tenant. Mount it beside
// /metrics, /healthz and /readyz, which the binary serves.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(RouteTransport, s.handleTransport)
	mux.HandleFunc(RouteOutcome, s.handleOutcome)
	return mux
}

// Mount serves Handler on its routes of mux.
func (s *Service) Mount(mux interface{ Handle(string, http.Handler) }) {
	h := s.Handler()
	mux.Handle(RouteTransport, h)
	mux.Handle(RouteOutcome, h)
}

// The routes Handler serves, as net/http ServeMux patterns, so a binary
// that hosts several roles can mount Handler on exactly these.
const (
	RouteTransport = "POST /v1/tenants/{tenant}/transport"
	RouteOutcome   = "GET /v1/tenants/{tenant}/outcomes/{message_id}"
)

// authorize checks the bearer token for scope ingest on the path's tenant.
func (s *Service) authorize(r *http.Request) (string, error) {
	claims, err := s.cfg.Verifier.FromRequest(r)
	if err != nil {
		return "", err
	}
	tenant := r.PathValue("tenant")
	if err := claims.Require(auth.ScopeIngest, tenant, ""); err != nil {
		return "", err
	}
	if err := subject.ValidTenant(tenant); err != nil {
		return "", refusal.BadRequest("tenant: %v", err)
	}
	return tenant, nil
}

func (s *Service) handleTransport(w http.ResponseWriter, r *http.Request) {
	if !s.inflight.enter() {
		s.fail(w, r, errDraining)
		return
	}
	defer s.inflight.leave()
	start := time.Now()
	defer func() { s.m.requests.WithLabelValues("http").Observe(time.Since(start).Seconds()) }()
	tenant, err := s.authorize(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	n := reservation(r, s.cfg.Limits.MaxBodyBytes)
	if err := s.reading.acquire(n); err != nil {
		s.fail(w, r, err)
		return
	}
	defer s.reading.release(n)
	buf := getBody()
	defer putBody(buf)
	body, err := httpapi.ReadBodyInto(r, s.cfg.Limits.MaxBodyBytes, *buf)
	*buf = body
	if err != nil {
		s.fail(w, r, err)
		return
	}
	msgs, err := decodeIntake(body, httpapi.IsMsgpack(r), s.limits())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	results, err := s.Submit(r.Context(), tenant, "http", msgs)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpapi.Write(w, r, http.StatusOK, Response{Results: results})
}

// bodies are request body buffers. A body is dead once its request is
// answered: inputs slice their payloads from it, but every write copies
// them and no result refers to them.
var bodies sync.Pool

// maxPooledBody bounds the buffers kept for reuse.
const maxPooledBody = 4 << 20

func getBody() *[]byte {
	if b, ok := bodies.Get().(*[]byte); ok {
		return b
	}
	return new([]byte)
}

func putBody(b *[]byte) {
	if cap(*b) <= maxPooledBody {
		*b = (*b)[:0]
		bodies.Put(b)
	}
}

func (s *Service) handleOutcome(w http.ResponseWriter, r *http.Request) {
	tenant, err := s.authorize(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !s.started.Load() {
		s.fail(w, r, ErrUnavailable.With("ingest is not started"))
		return
	}
	id := r.PathValue("message_id")
	subj, err := subject.Outcome(tenant, id)
	if err != nil {
		s.fail(w, r, refusal.BadRequest("message_id: want %d lowercase hexadecimal characters", subject.MessageIDHexLen))
		return
	}
	l, err := s.readOutcome(r.Context(), subj)
	if err != nil {
		s.log.Error("reading outcome", "err", err)
		s.fail(w, r, errOutcomesUnavailable)
		return
	}
	if l != nil {
		httpapi.Write(w, r, http.StatusOK, l.rec)
		return
	}
	// No record yet: an admitted input is its own first record.
	in, err := s.storedInput(r.Context(), tenant, "", id)
	if err != nil {
		s.log.Error("reading input", "err", err)
		s.fail(w, r, errOutcomesUnavailable)
		return
	}
	if in == nil {
		s.fail(w, r, ErrOutcomeNotFound)
		return
	}
	httpapi.Write(w, r, http.StatusOK, queuedFrom(id, in))
}

var errOutcomesUnavailable = ErrUnavailable.With("outcomes are unavailable")

// fail writes err, counting whole-request refusals by code.
func (s *Service) fail(w http.ResponseWriter, r *http.Request, err error) {
	s.m.refusals.WithLabelValues(refusal.Code(err)).Inc()
	httpapi.WriteError(w, r, err)
}
