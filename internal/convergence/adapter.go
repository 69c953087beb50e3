package convergence

import (
	"errors"
	"fmt"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"
)

// This file is a local adapter over mls-go for two facts the engine does not
// export yet: the ProposalRef of a PublicMessage proposal and the references
// a Commit consumes (RFC 9420 §5.4, §12.4). Both read bytes only; they never
// authenticate anything (the engine does that during replay).

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
