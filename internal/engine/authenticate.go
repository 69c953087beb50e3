package engine

import (
	"crypto/hmac"
	"errors"
	"slices"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"
	"github.com/thomas-vilte/mls-go/schedule"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// Sentinel causes of parent identification.
var (
	// ErrNotAuthenticated: the PublicMessage's membership tag does not verify
	// under this state, so this state is not the message's parent; another
	// candidate parent may still arrive (category missing_history, inbound
	// processing: the input stays deferred).
	ErrNotAuthenticated = errors.New("membership tag does not verify under this state")
	// ErrNoMembershipTag: the sender is not a member (an external sender or
	// a new member), so the message carries no membership tag and cannot
	// name its parent by it (RFC 9420 §6.2).
	ErrNoMembershipTag = errors.New("sender carries no membership tag")
)

// Authenticates reports whether this state's epoch secrets authenticate a
// member's PublicMessage handshake: its group and epoch are this state's and
// its membership tag verifies under this epoch's membership key and
// GroupContext (RFC 9420 §6.2). That identifies the state as the message's
// candidate parent before any signature or authorization check, which are
// terminal only once it does (inbound processing). A message of another
// group or epoch does not authenticate (false, nil). It checks nothing else
// and changes nothing. Errors are [*Error] values: ErrNoMembershipTag
// (missing_history) for a non-member sender, whose parent only replay can
// tell; invalid_encoding; unsupported_required_feature for what is not a
// PublicMessage handshake.
func (s *State) Authenticates(mlsMessage []byte) (ok bool, err error) {
	const op = "authenticate"
	defer recoverDecode(op, &err)
	c, pm, err := parsePublicHandshake(op, mlsMessage)
	if err != nil {
		return false, err
	}
	if s.checkGroup(op, c) != nil || s.checkEpoch(op, c) != nil {
		return false, nil
	}
	if pm.Content.Sender.Type != framing.SenderTypeMember {
		// No verdict either way; like a parent that is not here yet, it
		// must not be terminal for the caller.
		return false, fail(op, schema.CategoryMissingHistory, ErrNoMembershipTag)
	}
	return s.membershipTagVerifies(pm), nil
}

// membershipTagVerifies recomputes the membership tag of a member's
// PublicMessage under this epoch and compares it in constant time.
func (s *State) membershipTagVerifies(pm *framing.PublicMessage) bool {
	es := s.g.EpochSecrets()
	if es == nil || es.MembershipKey == nil || len(pm.MembershipTag) == 0 {
		return false
	}
	ac := &framing.AuthenticatedContent{
		WireFormat:   framing.WireFormatPublicMessage,
		Content:      pm.Content,
		Auth:         pm.Auth,
		GroupContext: s.g.GroupContext().Marshal(),
	}
	want := schedule.ComputeMembershipTag(s.g.CipherSuite(), es.MembershipKey.AsSlice(), ac.MarshalTBM())
	return hmac.Equal(want, pm.MembershipTag)
}

// ProposalRef returns a PublicMessage proposal's RFC 9420 §5.2 ProposalRef,
// RefHash("MLS 1.0 Proposal Reference", AuthenticatedContent) under this
// group's cipher suite: the value by which a commit names it. It does not
// authenticate the proposal; [State.ProcessHandshake] does, and its result
// carries the same ref.
func (s *State) ProposalRef(mlsMessage []byte) (ref []byte, err error) {
	const op = "proposal ref"
	defer recoverDecode(op, &err)
	c, pm, err := parsePublicHandshake(op, mlsMessage)
	if err != nil {
		return nil, err
	}
	if c.Class != schema.ClassProposal {
		return nil, fail(op, schema.CategoryInvalidEncoding, errNotProposal)
	}
	return proposalRefOf(pm, s.g.CipherSuite()), nil
}

var errNotProposal = errors.New("not a proposal")

func proposalRefOf(pm *framing.PublicMessage, cs ciphersuite.CipherSuite) []byte {
	ac := &framing.AuthenticatedContent{WireFormat: framing.WireFormatPublicMessage, Content: pm.Content, Auth: pm.Auth}
	return group.ComputeProposalRef(ac.Marshal(), cs)
}

// ConsumedProposalRefs returns the ProposalRefs a PublicMessage commit names
// by reference, in commit order (RFC 9420 §12.4): the proposals that must be
// applied to its parent before it, and whose dispositions follow the
// commit's. Inline proposals are part of the commit and are not listed. It
// does not authenticate the commit; [HandshakeResult.ProposalRefs] is the
// same list once processed.
func ConsumedProposalRefs(mlsMessage []byte) (refs [][]byte, err error) {
	const op = "consumed proposal refs"
	defer recoverDecode(op, &err)
	c, pm, err := parsePublicHandshake(op, mlsMessage)
	if err != nil {
		return nil, err
	}
	if c.Class != schema.ClassCommit {
		return nil, fail(op, schema.CategoryInvalidEncoding, errNotCommit)
	}
	commit, err := commitOf(op, pm)
	if err != nil {
		return nil, err
	}
	for _, por := range commit.Proposals {
		if por.Proposal == nil {
			refs = append(refs, slices.Clone(por.ProposalRef))
		}
	}
	return refs, nil
}

var errNotCommit = errors.New("not a commit")

// commitOf decodes a PublicMessage commit's body.
func commitOf(op string, pm *framing.PublicMessage) (*group.Commit, error) {
	data, ok := pm.Content.CommitData()
	if !ok {
		return nil, fail(op, schema.CategoryInvalidEncoding, errors.New("commit without body"))
	}
	commit, err := group.UnmarshalCommit(data)
	if err != nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	return commit, nil
}

// parsePublicHandshake classifies and decodes a PublicMessage proposal or
// commit; Marmot pins handshakes to PublicMessage, so anything else is a
// feature the fabric does not support. The classification has no
// MessageID: hashing a large commit is left to the callers that need it.
func parsePublicHandshake(op string, mlsMessage []byte) (Classification, *framing.PublicMessage, error) {
	c, err := classifyFraming(mlsMessage)
	if err != nil {
		return c, nil, err
	}
	if c.WireFormat != WirePublicMessage || (c.Class != schema.ClassCommit && c.Class != schema.ClassProposal) {
		return c, nil, fail(op, schema.CategoryUnsupportedRequiredFeature, ErrNotHandshake)
	}
	msg, err := framing.UnmarshalMLSMessage(mlsMessage)
	if err != nil {
		return c, nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	pm, ok := msg.AsPublic()
	if !ok {
		return c, nil, fail(op, schema.CategoryInvalidEncoding, ErrNotHandshake)
	}
	return c, pm, nil
}
