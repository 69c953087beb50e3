package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
)

// NATS intake: a request on fabric.intake.<tenant> (subject.Intake) with
// the same body as POST /v1/tenants/{tenant}/transport gets the same reply
// body. The workers answer subject.IntakePattern in queue group
// Config.QueueGroup. Who may publish there is decided by NATS account
// permissions (docs/ingest.md); with Config.NATSRequireToken the request
// must also carry a bearer token.
const (
	// HeaderStatus on a reply carries its status: 200, or the reply
	// status of the refusal in the body (replyStatuses).
	HeaderStatus = bus.HeaderReplyStatus
	// HeaderError on a refusal's reply carries its code, as in the body.
	HeaderError = bus.HeaderReplyError
	// HeaderContentType selects msgpack request and reply bodies when it
	// is application/msgpack, as Content-Type does on HTTP.
	HeaderContentType = "Content-Type"
	// HeaderAuthorization carries "Bearer <JWT>" when tokens are required.
	HeaderAuthorization = "Authorization"
	// HeaderRetryAfter on a refusal that says when to retry carries the
	// seconds until then, as on HTTP.
	HeaderRetryAfter = "Retry-After"
)

var errDraining = ErrUnavailable.With("ingest is draining")

// replyStatuses is the Fabric-Status of every refusal kind: the one place
// a refusal becomes a NATS reply status. The numbers are those HTTP
// answers with, so a transport gateway speaking both branches on one set
// (docs/ingest.md).
var replyStatuses = map[refusal.Kind]int{
	refusal.Invalid:         400,
	refusal.TooLarge:        413,
	refusal.Unauthenticated: 401,
	refusal.Forbidden:       403,
	refusal.NotFound:        404,
	refusal.Conflict:        409,
	refusal.Unprocessable:   422,
	refusal.RateLimited:     429,
	refusal.Unavailable:     503,
	refusal.StorageFull:     507,
	refusal.NotOffered:      501,
}

// replyStatusInternal answers an error that is no refusal.
const replyStatusInternal = 500

// replyRefusal is err as a refusal and its reply status; an error that is
// no refusal is an internal one whose message reveals nothing.
func replyRefusal(err error) (*refusal.Error, int) {
	var re *refusal.Error
	if errors.As(err, &re) {
		if st, ok := replyStatuses[re.Kind]; ok {
			return re, st
		}
	}
	return refusal.Internal, replyStatusInternal
}

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
	tenant, err := subject.ParseIntake(m.Subject)
	if err != nil {
		return nil, refusal.BadRequest("intake subject names no valid tenant")
	}
	if s.cfg.NATSRequireToken {
		token, ok := strings.CutPrefix(m.Header.Get(HeaderAuthorization), "Bearer ")
		if !ok || token == "" {
			return nil, auth.ErrUnauthenticated.With("missing bearer token")
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

// replyNATS answers m with resp, or with err as {"error": {code, message}},
// its reply status in Fabric-Status and its code in Fabric-Error.
func (s *Service) replyNATS(m *nats.Msg, resp *Response, err error) {
	status := 200
	var body any = resp
	out := nats.NewMsg(m.Reply)
	if err != nil {
		var re *refusal.Error
		re, status = replyRefusal(err)
		if status == replyStatusInternal {
			s.log.Error("intake request failed", "subject", m.Subject, "err", err)
		}
		if re.RetryAfter > 0 {
			out.Header.Set(HeaderRetryAfter, strconv.Itoa(int(math.Ceil(re.RetryAfter.Seconds()))))
		}
		out.Header.Set(HeaderError, re.Code)
		body = struct {
			Error *refusal.Error `json:"error" msgpack:"error"`
		}{re}
		s.m.refusals.WithLabelValues(re.Code).Inc()
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
