// Package convergence is Marmot convergence policy v1 for one hosted member's
// view of one group: it keeps the retained candidate states, builds candidate
// edges only by replaying MLS commit bytes through internal/engine, detects
// forks, runs the bounded convergence pass, selects one canonical branch in
// the pinned order and assigns every input its disposition (Marmot
// protocol-core/convergence.md, retained-history.md, foundation/errors.md,
// adopted versions; DESIGN §4, §5).
//
// The package is pure and deterministic: no NATS, no goroutines, no wall
// clock. The caller passes the time of each call, persists the [Group] with
// [Group.Marshal] (sealed, since it holds MLS secrets) and turns each
// [Result] into outcome records and client events. docs/convergence.md
// describes the model and the integration with internal/converge.
package convergence

import (
	"errors"
	"time"

	"github.com/fabric-mls/fabric/internal/engine"
)

// Policy is a convergence policy. Marmot pins one, [V1]; the fields exist so
// the code names each constant where it uses it, not to make them tunable.
type Policy struct {
	// MaxRewindCommits is how far back from the tip a branch may fork and
	// still be eligible; the retained anchor is tip − MaxRewindCommits.
	MaxRewindCommits uint64
	// AppPayloadPastEpochLimit is the app-payload window:
	// reference_tip_epoch − message_epoch ≤ limit.
	AppPayloadPastEpochLimit uint64
	// SettlementQuiescence closes a pass after this long without
	// selection-relevant input.
	SettlementQuiescence time.Duration
	// MaxConvergencePass closes a pass this long after it opened; later
	// input never extends it.
	MaxConvergencePass time.Duration
	// WitnessQuorumSendersPerEpoch is the distinct senders one branch epoch
	// needs to count toward quorum, and the cap of its witness score.
	WitnessQuorumSendersPerEpoch int
	// WitnessQuorumEpochs is how many branch epochs must meet sender quorum.
	WitnessQuorumEpochs int
	// MaxWitnessOverrideDepth is the depth boost of a branch with quorum.
	MaxWitnessOverrideDepth uint64
}

// V1 is the Marmot convergence policy, version 1 (convergence.md, DESIGN §5).
var V1 = Policy{
	MaxRewindCommits:             5,
	AppPayloadPastEpochLimit:     5,
	SettlementQuiescence:         1000 * time.Millisecond,
	MaxConvergencePass:           5000 * time.Millisecond,
	WitnessQuorumSendersPerEpoch: 2,
	WitnessQuorumEpochs:          1,
	MaxWitnessOverrideDepth:      1,
}

// validate checks the bound convergence.md puts on a policy.
func (p Policy) validate() error {
	switch {
	case p.MaxWitnessOverrideDepth > p.MaxRewindCommits:
		return errors.New("convergence: witness override depth exceeds the rollback horizon")
	case p.WitnessQuorumSendersPerEpoch < 1 || p.WitnessQuorumEpochs < 1:
		return errors.New("convergence: witness quorum must be positive")
	case p.SettlementQuiescence <= 0 || p.MaxConvergencePass < p.SettlementQuiescence:
		return errors.New("convergence: pass bounds out of order")
	}
	return nil
}

// ID is a message id: SHA-256 of the MLSMessage bytes; for a commit it is
// also its commit_digest, the tip_digest tie-breaker.
type ID = engine.MessageID

// Lifecycle is the group lifecycle state as far as convergence moves it
// (Marmot group-state.md).
type Lifecycle string

// Lifecycle values.
const (
	// Stable: the canonical branch is settled or advancing linearly.
	Stable Lifecycle = "stable"
	// Recovering: a fork was detected; nothing is delivered until the pass
	// selects and applies a branch.
	Recovering Lifecycle = "recovering"
	// Unrecoverable: retained state inside the horizon is lost; input is
	// retained only (MissingRetainedAnchor).
	Unrecoverable Lifecycle = "unrecoverable"
)

// Errors a caller branches on.
var (
	// ErrNoCutoff: Apply was called with no frozen pass, or with a cutoff of
	// another pass.
	ErrNoCutoff = errors.New("convergence: no frozen pass matches the cutoff")
	// ErrCorrupt: persisted bytes do not decode as a group.
	ErrCorrupt = errors.New("convergence: persisted state does not decode")
	// ErrUnrecoverable: the group lost retained state inside the horizon;
	// it retains input and applies nothing until a verified repair.
	ErrUnrecoverable = errors.New("convergence: group is unrecoverable")
	// ErrID: the input's ID is not SHA-256 of its bytes.
	ErrID = errors.New("convergence: input id is not the digest of its bytes")
	// ErrClass: the input's class is not commit, proposal or application.
	ErrClass = errors.New("convergence: input class does not enter convergence")
)
