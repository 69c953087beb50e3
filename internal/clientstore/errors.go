package clientstore

import "github.com/fabric-mls/fabric/internal/refusal"

// The refusals of the client stores (docs/client-stores.md); signals
// answers with the client and emit ones too. Malformed requests are
// refusal.ErrBadRequest naming the member.
var (
	ErrUnknownClient      = refusal.New(refusal.NotFound, "client_not_found", "no such client in this tenant")
	ErrClientExists       = refusal.New(refusal.Conflict, "client_exists", "an installation with this key is already registered")
	ErrSequenceConflict   = refusal.New(refusal.Conflict, "sequence_conflict", "a different association state is held at this sequence id")
	ErrNoAssociationState = refusal.New(refusal.NotFound, "no_association_state", "the client holds no association state for this inbox")
	// ErrEmitPending: the change is stored, its events are not emitted
	// yet; a retry of the request emits them.
	ErrEmitPending = refusal.New(refusal.Unavailable, "emit_pending", "the change is stored; its event is not emitted yet, retry the request to emit it")
	// ErrContention: the record changed under every attempt.
	ErrContention = refusal.New(refusal.Conflict, "contention", "the record changed under every attempt, retry")
)
