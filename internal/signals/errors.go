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
	// ErrUnknownGroup: a message signal names a group the client does not
	// hold (issue 26).
	ErrUnknownGroup = refusal.New(refusal.NotFound, "unknown_group", "the client holds no such group")
	// ErrMessageNotFound: a message signal names a message the client does
	// not hold in that group, or, for a status, one its installation did
	// not send.
	ErrMessageNotFound = refusal.New(refusal.NotFound, "message_not_found", "the client holds no such message in this group")
	// ErrStatusConflict: a status change whose previous is not the
	// message's status.
	ErrStatusConflict = refusal.New(refusal.Conflict, "status_conflict", "the message's status is not the change's previous status")
	// ErrAlreadyDeleted: a local deletion of a message already gone.
	ErrAlreadyDeleted = refusal.New(refusal.Conflict, "already_deleted", "the message is no longer delivered to the client")
	// ErrNoDownload: a download ends that did not start.
	ErrNoDownload = refusal.New(refusal.Conflict, "no_download", "no download of this attachment key started")
	// ErrTooManyLocalMessages: the group's record holds MaxLocalMessages
	// changed messages.
	ErrTooManyLocalMessages = refusal.New(refusal.Unprocessable, "too_many_local_messages", "the client holds the most local message changes of this group")
)
