package ingest

import (
	"github.com/fabric-mls/fabric/internal/quota"
	"github.com/fabric-mls/fabric/internal/refusal"
)

// The refusals of a whole intake request: nothing of it was acknowledged.
// An input the fabric takes and judges gets a category in its result
// instead (docs/ingest.md). Each code is also a label value of the refusals
// metric. Malformed requests are refusal.ErrBadRequest naming the member.
var (
	ErrBodyTooLarge    = refusal.New(refusal.TooLarge, "body_too_large", "body too large")
	ErrBatchTooLarge   = refusal.New(refusal.TooLarge, "batch_too_large", "too many messages in the batch")
	ErrMessageTooLarge = refusal.New(refusal.TooLarge, "message_too_large", "a payload is too large")
	// ErrRateLimited refuses a tenant past its message rate, with the time
	// until its bucket allows the request.
	ErrRateLimited = quota.ErrRateLimited
	// ErrByteRateLimited refuses a tenant past its payload byte rate.
	ErrByteRateLimited = quota.ErrByteRateLimited
	// ErrInputQuota refuses a tenant whose input stored on FABRIC_IN
	// within its MaxAge is at Config.InputBytes' bound.
	ErrInputQuota = quota.ErrInputQuota
	// ErrOverloaded refuses a request body while the worker holds
	// Limits.MaxBytesInFlight of them (retry after a second).
	ErrOverloaded = refusal.New(refusal.Unavailable, "overloaded", "the worker is reading its bound of request bytes")
	// ErrUnavailable: the worker is not taking input (not started,
	// draining) or could not store it; the whole request may be retried.
	ErrUnavailable = refusal.New(refusal.Unavailable, "unavailable", "ingest is not taking input")
	// ErrStorageFull refuses input while FABRIC_IN (or another stream it
	// writes) is at its byte bound: retrying at once cannot help.
	ErrStorageFull = refusal.New(refusal.StorageFull, "storage_full", "the input stream is at its byte bound; nothing was acknowledged")
	// ErrOutcomeNotFound: no outcome and no input under a message id.
	ErrOutcomeNotFound = refusal.New(refusal.NotFound, "not_found", "no outcome recorded for this message id")
)
