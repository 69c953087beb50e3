package signals

import (
	"github.com/fabric-mls/fabric/internal/refusal"
)

// The refusals of signals; an unknown client, contention and a pending
// emit are the client stores' (clientstore.ErrUnknownClient, ...).
var (
	// ErrInvalidEvent: the event breaks the client events contract; its
	// schema.ValidationError names the member.
	ErrInvalidEvent = refusal.New(refusal.Unprocessable, "invalid_event", "the event is not valid")
	// ErrKindNotSignal: the kind is made by the fabric, not reported.
	ErrKindNotSignal = refusal.New(refusal.Unprocessable, "kind_not_signal", "this kind is not a signal")
	// ErrIdempotencyKeyReused: the key was used for a different signal.
	ErrIdempotencyKeyReused = refusal.New(refusal.Unprocessable, "idempotency_key_reused", "this "+IdempotencyHeader+" was used for a different signal")
	// ErrTooManyStreams: the client has MaxStreams open streams.
	ErrTooManyStreams = refusal.New(refusal.Unprocessable, "too_many_streams", "the client has its most open streams; close one first")
)
