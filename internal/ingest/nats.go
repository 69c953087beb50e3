package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/httpapi"
)

// NATS intake: a request on fabric.intake.<tenant> with the same body as
// POST /v1/tenants/{tenant}/transport gets the same reply body. Who may
// publish there is decided by NATS account permissions (docs/ingest.md);
// with Config.NATSRequireToken the request must also carry a bearer token.
const (
	// IntakePrefix starts every intake subject.
	IntakePrefix = "fabric.intake."
	// IntakeWildcard is what the workers subscribe to, in queue group
	// Config.QueueGroup.
	IntakeWildcard = IntakePrefix + "*"
	// HeaderStatus on a reply carries the HTTP status the same request
	// would have got: 200, or the status of the error in the body.
	HeaderStatus = "Fabric-Status"
	// HeaderContentType selects msgpack request and reply bodies when it
	// is application/msgpack, as Content-Type does on HTTP.
	HeaderContentType = "Content-Type"
	// HeaderAuthorization carries "Bearer <JWT>" when tokens are required.
	HeaderAuthorization = "Authorization"
	// HeaderRetryAfter on a 429 reply carries the seconds until the
	// tenant's rate allows the request, as on HTTP.
	HeaderRetryAfter = "Retry-After"
)

// IntakeSubject is the subject a tenant's transport messages are requested
// on.
func IntakeSubject(tenant string) (string, error) {
	if err := subject.ValidTenant(tenant); err != nil {
		return "", err
	}
	return IntakePrefix + tenant, nil
}

var errDraining = httpapi.Errorf(http.StatusServiceUnavailable, codeUnavailable, "ingest is draining")

// handleNATS runs on the subscription's goroutine: it takes a slot (so a
// burst waits here, in the client's buffer, rather than spawning without
// bound) and serves the request on its own goroutine.
func (s *Service) handleNATS(m *nats.Msg) {
	if m.Reply == "" {
		// Nobody to answer, so nothing could be acknowledged: refuse.
		s.m.refusals.WithLabelValues("no_reply").Inc()
		return
	}
	if !s.inflight.enter() {
		s.replyNATS(m, nil, errDraining)
		return
	}
	s.slots <- struct{}{}
	go func() {
		defer func() { <-s.slots; s.inflight.leave() }()
		start := time.Now()
		resp, err := s.serveNATS(m)
		s.replyNATS(m, resp, err)
		s.m.requests.WithLabelValues("nats").Observe(time.Since(start).Seconds())
	}()
}

func (s *Service) serveNATS(m *nats.Msg) (*Response, error) {
	tenant, ok := strings.CutPrefix(m.Subject, IntakePrefix)
	if !ok || subject.ValidTenant(tenant) != nil {
		return nil, httpapi.BadRequest("intake subject names no valid tenant")
	}
	if s.cfg.NATSRequireToken {
		token, ok := strings.CutPrefix(m.Header.Get(HeaderAuthorization), "Bearer ")
		if !ok || token == "" {
			return nil, &auth.Error{Status: http.StatusUnauthorized, Code: "unauthenticated", Reason: "missing bearer token"}
		}
		claims, err := s.cfg.Verifier.Verify(context.Background(), token)
		if err != nil {
			return nil, err
		}
		if err := claims.Require(auth.ScopeIngest, tenant, ""); err != nil {
			return nil, err
		}
	}
	msgs, err := decodeIntake(m.Data, isMsgpackHeader(m.Header), s.limits())
	if err != nil {
		return nil, err
	}
	results, err := s.Submit(context.Background(), tenant, "nats", msgs)
	if err != nil {
		return nil, err
	}
	return &Response{Results: results}, nil
}

func isMsgpackHeader(h nats.Header) bool {
	ct := h.Get(HeaderContentType)
	mt, _, _ := strings.Cut(ct, ";")
	return strings.TrimSpace(mt) == httpapi.ContentTypeMsgpack
}

// replyNATS answers m with resp, or with err as {"error": {code, message}}
// and its HTTP status in Fabric-Status.
func (s *Service) replyNATS(m *nats.Msg, resp *Response, err error) {
	status := http.StatusOK
	var body any = resp
	out := nats.NewMsg(m.Reply)
	var rl *rateLimited
	if errors.As(err, &rl) {
		out.Header.Set(HeaderRetryAfter, strconv.Itoa(int(math.Ceil(rl.retryAfter.Seconds()))))
	}
	if err != nil {
		he := toHTTPError(err)
		status = he.Status
		body = struct {
			Error *httpapi.Error `json:"error" msgpack:"error"`
		}{he}
		s.m.refusals.WithLabelValues(he.Code).Inc()
	}
	var encErr error
	if isMsgpackHeader(m.Header) {
		out.Header.Set(HeaderContentType, httpapi.ContentTypeMsgpack)
		out.Data, encErr = msgpack.Marshal(body)
	} else {
		out.Header.Set(HeaderContentType, "application/json")
		out.Data, encErr = json.Marshal(body)
	}
	if encErr != nil {
		s.log.Error("encode intake reply", "err", encErr)
		return
	}
	out.Header.Set(HeaderStatus, strconv.Itoa(status))
	if err := m.RespondMsg(out); err != nil {
		s.log.Warn("answer intake request", "err", err)
	}
}

// toHTTPError maps err to the *httpapi.Error HTTP would answer with.
func toHTTPError(err error) *httpapi.Error {
	var he *httpapi.Error
	var ae *auth.Error
	switch {
	case errors.As(err, &he):
		return he
	case errors.As(err, &ae):
		return &httpapi.Error{Status: ae.Status, Code: ae.Code, Message: ae.Reason}
	}
	return &httpapi.Error{Status: http.StatusInternalServerError, Code: "internal", Message: "internal error"}
}
