package fanout

import (
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// The refusals of the gateway, before an upgrade (an HTTP answer) or to a
// subscribe (an error frame with the same code); auth's refusals too.
var (
	ErrUnavailable   = refusal.New(refusal.Unavailable, wire.CodeUnavailable, "the gateway is unavailable")
	ErrUnknownClient = refusal.New(refusal.NotFound, wire.CodeUnknownClient, "the tenant has no hosted client with this id")
	ErrInvalidFilter = refusal.New(refusal.Invalid, wire.CodeInvalidFilter, "invalid filter")
	ErrMalformed     = refusal.New(refusal.Invalid, wire.CodeMalformedFrame, "malformed frame")
	// ErrTooManyConnections refuses a connection past the tenant's quota.
	ErrTooManyConnections = refusal.New(refusal.RateLimited, CodeTooManyConnections, "the tenant has its most open event connections on this gateway")
	// ErrReplayBudget refuses a resuming subscribe while the tenant's
	// replay budget is spent.
	ErrReplayBudget = refusal.New(refusal.RateLimited, CodeReplayBudget, "the tenant's replay budget is spent; resume later")
	// ErrConnectionTokensOff: the gateway has no secret to mint
	// connection tokens with.
	ErrConnectionTokensOff = refusal.New(refusal.NotOffered, "connection_tokens_off", "this gateway has no signing secret (FABRIC_JWT_SECRET) to mint connection tokens")
)

var (
	errDraining               = ErrUnavailable.With("gateway is draining")
	errEventSourceUnavailable = ErrUnavailable.With("event source is unavailable")
)
