package convergence

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"

	"github.com/fabric-mls/fabric/internal/engine"
)

// This file is a local adapter over mls-go for three facts the engine does
// not export yet: the ProposalRef of a PublicMessage proposal, the
// references a Commit consumes (RFC 9420 §5.4, §12.4), and whether a
// retained state's membership key authenticates a PublicMessage, which
// identifies the candidate parent before any signature or authorization
// check can be terminal (errors.md, "Dispositions").

var errNotPublic = errors.New("not a PublicMessage")

// proposalRef returns RefHash("MLS 1.0 Proposal Reference",
// AuthenticatedContent) of a PublicMessage proposal, as mls-go stores it.
func proposalRef(mlsMessage []byte, suite uint16) (ref []byte, err error) {
	defer recoverParse(&err)
	pm, err := public(mlsMessage)
	if err != nil {
		return nil, err
	}
	if pm.Content.ContentType() != framing.ContentTypeProposal {
		return nil, errors.New("not a proposal")
	}
	ac := &framing.AuthenticatedContent{WireFormat: framing.WireFormatPublicMessage, Content: pm.Content, Auth: pm.Auth}
	return group.ComputeProposalRef(ac.Marshal(), ciphersuite.CipherSuite(suite)), nil
}

// commitRefs returns the ProposalRefs a PublicMessage commit names, in
// commit order; inline proposals are not separate inputs and are skipped.
func commitRefs(mlsMessage []byte) (refs [][]byte, err error) {
	defer recoverParse(&err)
	pm, err := public(mlsMessage)
	if err != nil {
		return nil, err
	}
	data, ok := pm.Content.CommitData()
	if !ok {
		return nil, errors.New("commit without body")
	}
	c, err := group.UnmarshalCommit(data)
	if err != nil {
		return nil, fmt.Errorf("commit body: %w", err)
	}
	for _, por := range c.Proposals {
		if por.Proposal == nil && len(por.ProposalRef) > 0 {
			refs = append(refs, por.ProposalRef)
		}
	}
	return refs, nil
}

func public(mlsMessage []byte) (*framing.PublicMessage, error) {
	m, err := framing.UnmarshalMLSMessage(mlsMessage)
	if err != nil {
		return nil, fmt.Errorf("mls message: %w", err)
	}
	pm, ok := m.AsPublic()
	if !ok {
		return nil, errNotPublic
	}
	return pm, nil
}

// recoverParse turns a parser panic on hostile bytes into an error.
func recoverParse(err *error) {
	if r := recover(); r != nil {
		*err = errors.New("mls parser rejected the input")
	}
}

// parentAuth is what identifies a node as a message's parent: the membership
// key and GroupContext of its epoch (RFC 9420 §6.2).
type parentAuth struct {
	suite ciphersuite.CipherSuite
	key   *ciphersuite.Secret
	gc    []byte
}

// authOf reads a state's membership key and GroupContext from its engine
// snapshot (mls-go MarshalState inside the engine's envelope). It fails when
// the format is not the expected one; the caller then falls back to
// treating a signature failure as "not this parent".
func authOf(st *engine.State) (*parentAuth, error) {
	b, err := st.Snapshot()
	if err != nil {
		return nil, err
	}
	defer clear(b)
	var env struct {
		State json.RawMessage `json:"state"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return nil, fmt.Errorf("snapshot envelope: %w", err)
	}
	var sd struct {
		CipherSuite  uint16 `json:"cipher_suite"`
		GroupContext []byte `json:"group_context"`
		EpochSecrets *struct {
			MembershipKey []byte `json:"membership_key"`
		} `json:"epoch_secrets"`
	}
	if err := json.Unmarshal(env.State, &sd); err != nil {
		return nil, fmt.Errorf("snapshot state: %w", err)
	}
	if sd.EpochSecrets == nil || len(sd.EpochSecrets.MembershipKey) == 0 || len(sd.GroupContext) == 0 || sd.CipherSuite != st.CipherSuite() {
		return nil, errors.New("snapshot without membership key")
	}
	return &parentAuth{suite: ciphersuite.CipherSuite(sd.CipherSuite), key: ciphersuite.NewSecret(sd.EpochSecrets.MembershipKey), gc: sd.GroupContext}, nil
}

// verify reports whether the membership tag of a member's PublicMessage
// verifies under this state; applicable is false for other senders, which
// carry no membership tag.
func (a *parentAuth) verify(mlsMessage []byte) (match, applicable bool) {
	defer func() {
		if recover() != nil {
			match, applicable = false, false
		}
	}()
	pm, err := public(mlsMessage)
	if err != nil || pm.Content.Sender.Type != framing.SenderTypeMember {
		return false, false
	}
	return pm.VerifyMembershipTagWithContext(a.suite, a.key, a.gc) == nil, true
}
