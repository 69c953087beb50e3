package converge

import (
	"context"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/convergence"
)

// MLS is what converge asks of the MLS engine. It is the seam between
// convergence and internal/engine: an adapter over the engine implements it
// (engine.go), and nothing else in converge touches MLS.
type MLS interface {
	// WelcomeRefs returns the KeyPackageRefs a Welcome's secrets are
	// addressed to.
	WelcomeRefs(welcome []byte) ([][]byte, error)
	// Join joins a hosted client from a Welcome addressed to one of its
	// KeyPackages. The returned sealed installation replaces the stored
	// one when the join consumed a KeyPackage.
	Join(ctx context.Context, client Client, welcome []byte) (MemberState, Joined, error)
	// JoinView joins a hosted client from a Welcome into view, its group's
	// one view of the hosted members, with only the client's keys, when
	// the Welcome is into the epoch of a state the view retains
	// (convergence.Group.JoinWelcome, docs/shared-state.md). ok is false,
	// and view unchanged, otherwise: the caller joins in full (Join), which
	// gives the verdict.
	JoinView(ctx context.Context, client Client, welcome []byte, view *convergence.Group) (Joined, bool, error)
	// Restore opens a member's state from its snapshot.
	Restore(ctx context.Context, client Client, snapshot []byte) (MemberState, error)
}

// Client is a hosted client as converge needs it to run its MLS state.
type Client struct {
	Tenant   string
	ClientID string
	InboxID  string
	// InstallationKey is the leaf signature public key.
	InstallationKey []byte
	// Sealed is the engine-sealed installation (private keys).
	Sealed []byte
}

// Joined is what a join from a Welcome tells about the group.
type Joined struct {
	GroupID []byte
	Epoch   uint64
	// AdderInboxID is the inbox of the Welcome's author: the GroupInfo
	// signer (JOIN-025).
	AdderInboxID string
	// KeyPackageRef is the KeyPackage the join used, retired once the
	// join is stored (Marmot joining.md steps 11–12).
	KeyPackageRef []byte
	// Components are the group's components at Epoch.
	Components components.Set
}

// MemberState is one hosted member's MLS state of one group.
type MemberState interface {
	// Epoch is the state's epoch.
	Epoch() uint64
	// Components are the group's components at this epoch.
	Components() components.Set
	// GroupEventKey is MLS-Exporter("fabric", "group-event", 32) of this
	// epoch (DESIGN section 3).
	GroupEventKey() ([]byte, error)
	// Leaves are the group's member leaves at this epoch.
	Leaves() []Leaf
	// Snapshot serialises the state.
	Snapshot() ([]byte, error)
	// Proposal processes a PublicMessage proposal and returns the state
	// that holds it; the receiver is left unchanged.
	Proposal(ctx context.Context, msg []byte) (MemberState, ProposalInfo, error)
	// Decrypt opens an application PrivateMessage, advancing the sender's
	// ratchet in place.
	Decrypt(ctx context.Context, msg []byte) (AppMessage, error)
}

// Leaf names one member leaf.
type Leaf struct {
	InboxID         string
	InstallationKey []byte
}

// ProposalInfo is what a stored proposal is.
type ProposalInfo struct {
	// SelfRemoveInboxID is set when the proposal is a Remove of its
	// sender's own leaf: a leave request (GMOD-031).
	SelfRemoveInboxID string
}

// AppMessage is a decrypted application message.
type AppMessage struct {
	Sender    Leaf
	Plaintext []byte
}
