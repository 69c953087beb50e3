package fanout

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/fanout/queue"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

type sseSink struct {
	w         http.ResponseWriter
	rc        *http.ResponseController
	gathering bool // frames wait in net/http's buffer until flush
}

func (s *sseSink) writeFrame(b []byte) error {
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	if s.gathering {
		return nil
	}
	return s.rc.Flush()
}

func (s *sseSink) gather() { s.gathering = true }

func (s *sseSink) flush() error {
	s.gathering = false
	return s.rc.Flush()
}

func (s *sseSink) setDeadline(t time.Time) { _ = s.rc.SetWriteDeadline(t) }

func (s *sseSink) ping(ctx context.Context) error {
	if dl, ok := ctx.Deadline(); ok {
		s.setDeadline(dl)
		defer s.setDeadline(time.Time{})
	}
	return s.writeFrame([]byte(": ping\n\n"))
}

// serveSSE serves GET /v1/tenants/{tenant}/clients/{client_id}/events as
// Server-Sent Events: one subscription, no credit; an event's slot is freed
// when its write completes, under the same bound (EVENT-030). Each event's
// id is its stream sequence, so a reconnecting EventSource (Last-Event-ID)
// resumes where it stopped, as the SDK does.
func (g *Gateway) serveSSE(w http.ResponseWriter, r *http.Request) {
	tenant, client := r.PathValue("tenant"), r.PathValue("client_id")
	var (
		claims auth.Claims
		err    error
	)
	switch tok := r.URL.Query().Get("access_token"); {
	case tok != "" && r.Header.Get("Authorization") == "" && !g.cfg.AllowQueryToken:
		err = auth.ErrUnauthenticated.With("access_token in the URL is off on this gateway; send Authorization: Bearer, or use the WebSocket with a connect frame")
	case tok != "" && r.Header.Get("Authorization") == "":
		// EventSource cannot set headers; RFC 6750 §2.3 allows the query.
		claims, err = g.cfg.Verifier.Verify(r.Context(), tok)
	default:
		claims, err = g.cfg.Verifier.FromRequest(r)
	}
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	// EVENT-056: another tenant's or another client's events are refused.
	if err := claims.Require(auth.ScopeEvents, tenant, client); err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	if err := subject.ValidClient(client); err != nil {
		httpapi.WriteError(w, r, refusal.BadRequest("%v", err))
		return
	}
	f, err := sseFilter(r)
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	if err := g.admitConn(tenant); err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	defer g.releaseConn(tenant)
	out := &sseSink{w: w, rc: http.NewResponseController(w)}
	c := newConn(g, wire.JSON, true, claims, out)
	if !g.addConn(c) {
		httpapi.WriteError(w, r, errDraining)
		return
	}
	defer g.removeConn(c)
	// An EventSource reconnecting sends the id of the last event it got:
	// the stream sequence, so the subscription resumes after it.
	var after uint64
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		if after, err = strconv.ParseUint(v, 10, 64); err != nil {
			httpapi.WriteError(w, r, refusal.BadRequest("Last-Event-ID is not an event id of this stream"))
			return
		}
	}
	s, rerr := c.subscribe(r.Context(), tenant, client, f, after, nil, 0)
	if s == nil {
		httpapi.WriteError(w, r, rerr)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// The comment tells a client the subscription is registered (EVENT-014).
	c.announce(s, []byte(": subscribed\n\n"))
	if !claims.ExpiresAt.IsZero() {
		expiry := time.AfterFunc(time.Until(claims.ExpiresAt), func() { c.drain(wire.ReasonTokenExpired) })
		defer expiry.Stop()
	}
	_ = c.writeLoop(r.Context())
	c.endAll("")
}

// sseFilter reads the filter from the query: kinds (comma separated;
// absent selects every kind), group_ids (lowercase hex, comma separated) and
// references_own_messages=true. access_token is the bearer token of a
// browser's EventSource, which cannot send an Authorization header.
func sseFilter(r *http.Request) (schema.EventFilter, error) {
	q := r.URL.Query()
	// No kinds parameter selects every kind, as a plain EventSource on the
	// URL expects; kinds= (empty) selects none, as [] does in a filter.
	f := schema.EventFilter{Kinds: schema.AllKinds()}
	if q.Has("kinds") {
		f.Kinds = []schema.EventKind{}
		for k := range strings.SplitSeq(q.Get("kinds"), ",") {
			if k != "" {
				f.Kinds = append(f.Kinds, schema.EventKind(k))
			}
		}
	}
	if q.Has("group_ids") {
		f.GroupIDs = []schema.Bytes{}
		for gh := range strings.SplitSeq(q.Get("group_ids"), ",") {
			if gh == "" {
				continue
			}
			if subject.ValidGroup(gh) != nil {
				return schema.EventFilter{}, ErrInvalidFilter.With("group_ids must be lowercase hex")
			}
			b, _ := hex.DecodeString(gh)
			f.GroupIDs = append(f.GroupIDs, b)
		}
	}
	if v := q.Get("references_own_messages"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return schema.EventFilter{}, ErrInvalidFilter.With("references_own_messages must be true or false")
		}
		f.ReferencesOwnMessages = b
	}
	return f, nil
}

// appendSSEEvent formats one event: event: <kind>, id: <seq>, data: <JSON>.
func appendSSEEvent(buf []byte, it queue.Item[*event]) []byte {
	if it.Lagged {
		buf = append(buf, "event: lagged\ndata: "...)
		buf = wire.AppendLagged(wire.JSON, buf, it.Discarded)
		return append(buf, "\n\n"...)
	}
	buf = append(buf, "event: "...)
	buf = append(buf, it.Value.kind...)
	buf = append(buf, "\nid: "...)
	buf = strconv.AppendUint(buf, it.Value.seq, 10)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, it.Value.json...) // encoding/json output has no newline
	return append(buf, "\n\n"...)
}

// appendSSEControl formats an ended or error frame as an SSE event whose
// data is the frame's JSON.
func appendSSEControl(buf []byte, f *wire.Frame) []byte {
	buf = append(buf, "event: "...)
	buf = append(buf, f.Op...)
	buf = append(buf, "\ndata: "...)
	b, _ := json.Marshal(struct {
		Reason  string `json:"reason,omitempty"`
		Code    string `json:"code,omitempty"`
		Message string `json:"message,omitempty"`
	}{f.Reason, f.Code, f.Message})
	buf = append(buf, b...)
	return append(buf, "\n\n"...)
}
