package httpapi_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/fanout"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/ingest"
	"github.com/fabric-mls/fabric/internal/read"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/internal/signals"
)

// TestRefusalStatuses is the HTTP mapping table, tested once: every
// refusal the core answers with keeps the status and code it has always
// had (docs/ingest.md, docs/client-stores.md, the gateway's), wrapped or
// not, and every kind has a status of its own class.
func TestRefusalStatuses(t *testing.T) {
	for _, tc := range []struct {
		err    *refusal.Error
		status int
		code   string
	}{
		{refusal.ErrBadRequest, 400, "bad_request"},
		{httpapi.ErrBodyTooLarge, 413, "body_too_large"},
		{auth.ErrUnauthenticated, 401, "unauthenticated"},
		{auth.ErrForbidden, 403, "forbidden"},
		{ingest.ErrBodyTooLarge, 413, "body_too_large"},
		{ingest.ErrBatchTooLarge, 413, "batch_too_large"},
		{ingest.ErrMessageTooLarge, 413, "message_too_large"},
		{ingest.ErrRateLimited, 429, "rate_limited"},
		{ingest.ErrByteRateLimited, 429, "byte_rate_limited"},
		{ingest.ErrOverloaded, 503, "overloaded"},
		{ingest.ErrUnavailable, 503, "unavailable"},
		{ingest.ErrStorageFull, 507, "storage_full"},
		{ingest.ErrOutcomeNotFound, 404, "not_found"},
		{clientstore.ErrUnknownClient, 404, "client_not_found"},
		{clientstore.ErrClientExists, 409, "client_exists"},
		{clientstore.ErrSequenceConflict, 409, "sequence_conflict"},
		{clientstore.ErrNoAssociationState, 404, "no_association_state"},
		{clientstore.ErrEmitPending, 503, "emit_pending"},
		{clientstore.ErrContention, 409, "contention"},
		{signals.ErrInvalidEvent, 422, "invalid_event"},
		{signals.ErrKindNotSignal, 422, "kind_not_signal"},
		{signals.ErrIdempotencyKeyReused, 422, "idempotency_key_reused"},
		{signals.ErrTooManyStreams, 422, "too_many_streams"},
		{signals.ErrUnknownGroup, 404, "unknown_group"},
		{signals.ErrMessageNotFound, 404, "message_not_found"},
		{signals.ErrStatusConflict, 409, "status_conflict"},
		{signals.ErrAlreadyDeleted, 409, "already_deleted"},
		{signals.ErrNoDownload, 409, "no_download"},
		{signals.ErrTooManyLocalMessages, 422, "too_many_local_messages"},
		{fanout.ErrUnavailable, 503, "unavailable"},
		{fanout.ErrUnknownClient, 404, "unknown_client"},
		{fanout.ErrInvalidFilter, 400, "invalid_filter"},
		{fanout.ErrMalformed, 400, "malformed_frame"},
		{fanout.ErrTooManyConnections, 429, "too_many_connections"},
		{fanout.ErrReplayBudget, 429, "replay_budget_exceeded"},
		{fanout.ErrConnectionTokensOff, 501, "connection_tokens_off"},
		{read.ErrConversationNotFound, 404, "conversation_not_found"},
		{read.ErrMessageNotFound, 404, "message_not_found"},
	} {
		err := fmt.Errorf("context: %w", tc.err.With("a message"))
		if got := httpapi.Status(err); got != tc.status || refusal.Code(err) != tc.code || !errors.Is(err, tc.err) {
			t.Errorf("%s: status %d code %q, want %d %q", tc.err.Code, got, refusal.Code(err), tc.status, tc.code)
		}
	}
	seen := map[int]bool{}
	for _, k := range refusal.Kinds {
		st := httpapi.Status(&refusal.Error{Kind: k, Code: "x"})
		if st < 400 || st == 500 || seen[st] {
			t.Errorf("kind %s: status %d (500, not an error, or another kind's)", k, st)
		}
		seen[st] = true
	}
	if httpapi.Status(errors.New("x")) != 500 {
		t.Error("an error that is no refusal is not a 500")
	}
}

// A refusal that says when to retry answers with Retry-After in whole
// seconds, rounded up.
func TestWriteErrorRetryAfter(t *testing.T) {
	w := httptest.NewRecorder()
	httpapi.WriteError(w, httptest.NewRequest(http.MethodPost, "/", nil), ingest.ErrRateLimited.After(1500*time.Millisecond))
	if w.Code != 429 || w.Header().Get("Retry-After") != "2" {
		t.Fatalf("%d Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
}
