package converge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/convergence"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// EngineMLS is the MLS seam over internal/engine. Member state snapshots
// are sealed with the vault before they leave the process: they hold epoch
// secrets and private keys.
type EngineMLS struct {
	Vault *engine.Vault
	// Signatures, when set, is shared by every member state the seam
	// opens, so the hosted members of a group verify a message's sender
	// signature once between them (engine.SignatureCache). New sets one
	// when it is nil.
	Signatures *engine.SignatureCache
	// Welcomes, when set, lets the hosted members one Welcome adds join
	// with one check of its GroupInfo and ratchet tree between them
	// (engine.WelcomeCache). New sets one when it is nil.
	Welcomes *engine.WelcomeCache
	// parsed, when set, is the last Welcome JoinView parsed: the hosted
	// members one Welcome adds parse it once. New sets it.
	parsed *parsedWelcome
}

// parsedWelcome is one Welcome parsed (engine.ParseWelcome), kept for the
// next join from it: a Welcome's size, and its parsing, grow with the
// group. It is safe for concurrent use.
type parsedWelcome struct {
	mu  sync.Mutex
	msg []byte
	pw  *engine.ParsedWelcome
}

// parse returns welcome parsed, from p when it is the one p holds.
func (p *parsedWelcome) parse(welcome []byte) (*engine.ParsedWelcome, error) {
	if p == nil {
		return engine.ParseWelcome(welcome)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pw != nil && bytes.Equal(p.msg, welcome) {
		return p.pw, nil
	}
	pw, err := engine.ParseWelcome(welcome)
	if err != nil {
		return nil, err
	}
	p.msg, p.pw = bytes.Clone(welcome), pw
	return pw, nil
}

var _ MLS = EngineMLS{}

// errNotWelcome reports bytes that are not a Welcome.
var errNotWelcome = errors.New("not a Welcome")

// WelcomeRefs returns the KeyPackageRefs the Welcome's secrets name
// (RFC 9420 §12.4.3.1 new_member).
func (e EngineMLS) WelcomeRefs(welcome []byte) ([][]byte, error) {
	c, err := engine.Classify(welcome)
	if err != nil {
		return nil, err
	}
	if c.WireFormat != engine.WireWelcome || len(welcome) < 4 {
		return nil, &engine.Error{Op: "welcome refs", Category: schema.CategoryInvalidEncoding, Err: errNotWelcome}
	}
	w, err := group.UnmarshalWelcome(welcome[4:])
	if err != nil {
		return nil, &engine.Error{Op: "welcome refs", Category: schema.CategoryInvalidEncoding, Err: err}
	}
	out := make([][]byte, 0, len(w.Secrets))
	for _, s := range w.Secrets {
		out = append(out, slices.Clone(s.NewMember))
	}
	return out, nil
}

// Join opens the client's sealed installation and joins from the Welcome.
func (e EngineMLS) Join(_ context.Context, c Client, welcome []byte) (MemberState, Joined, error) {
	inst, err := e.Vault.Open(c.Sealed)
	if err != nil {
		return nil, Joined{}, fmt.Errorf("open installation: %w", err)
	}
	st, info, err := inst.Join(welcome, nil, engine.WithWelcomeCache(e.Welcomes))
	if err != nil {
		return nil, Joined{}, err
	}
	st.ShareSignatures(e.Signatures)
	return &engineState{st: st, vault: e.Vault}, joined(info), nil
}

// JoinView opens the client's installation and joins it into view with
// only its keys (convergence.Group.JoinWelcome), the Welcome checked once
// for every hosted member it adds (e.Welcomes).
func (e EngineMLS) JoinView(_ context.Context, c Client, welcome []byte, view *convergence.Group) (Joined, bool, error) {
	pw, err := e.parsed.parse(welcome)
	if err != nil {
		return Joined{}, false, err
	}
	inst, err := e.Vault.Open(c.Sealed)
	if err != nil {
		return Joined{}, false, fmt.Errorf("open installation: %w", err)
	}
	info, ok, err := view.JoinWelcome(c.ClientID, inst, pw, e.Welcomes)
	if err != nil || !ok {
		return Joined{}, false, err
	}
	return joined(info), true, nil
}

// joined is what a join tells converge.
func joined(info *engine.JoinInfo) Joined {
	return Joined{GroupID: info.GroupID, Epoch: info.Epoch, AdderInboxID: info.Adder.InboxID, KeyPackageRef: info.KeyPackageRef,
		Components: info.Components}
}

// Restore opens a sealed snapshot.
func (e EngineMLS) Restore(_ context.Context, _ Client, snapshot []byte) (MemberState, error) {
	raw, err := e.Vault.OpenState(snapshot)
	if err != nil {
		return nil, fmt.Errorf("open state: %w", err)
	}
	defer clear(raw)
	st, err := engine.Restore(raw)
	if err != nil {
		return nil, err
	}
	st.ShareSignatures(e.Signatures)
	return &engineState{st: st, vault: e.Vault}, nil
}

// engineState is a MemberState over engine.State.
type engineState struct {
	st    *engine.State
	vault *engine.Vault
}

func (s *engineState) Epoch() uint64 { return s.st.Epoch() }

func (s *engineState) Components() components.Set {
	set, _, err := s.st.Components()
	if err != nil {
		return components.Set{}
	}
	return set
}

func (s *engineState) Leaves() []Leaf {
	if s.st == nil {
		return nil
	}
	var out []Leaf
	for _, m := range s.st.Members() {
		out = append(out, Leaf{InboxID: m.InboxID, InstallationKey: m.InstallationKey})
	}
	return out
}

func (s *engineState) GroupEventKey() ([]byte, error) {
	k, err := s.st.GroupEventKey()
	if err != nil {
		return nil, err
	}
	return k[:], nil
}

func (s *engineState) Snapshot() ([]byte, error) {
	raw, err := s.st.Snapshot()
	if err != nil {
		return nil, err
	}
	defer clear(raw)
	return s.vault.SealState(raw)
}

// errWrongClass reports a handshake of the other kind than the input's
// class said.
var errWrongClass = errors.New("handshake is not of the classified kind")

func (s *engineState) Proposal(_ context.Context, msg []byte) (MemberState, ProposalInfo, error) {
	next, res, err := s.st.ProcessHandshake(msg)
	if err != nil {
		return nil, ProposalInfo{}, err
	}
	if res.Class != schema.ClassProposal {
		return nil, ProposalInfo{}, &engine.Error{Op: "proposal", Category: schema.CategoryInvalidEncoding, Err: errWrongClass}
	}
	var pi ProposalInfo
	if removed, ok := removeTarget(msg); ok && removed == res.Sender.Leaf && res.Sender.InboxID != "" {
		pi.SelfRemoveInboxID = res.Sender.InboxID // GMOD-031 leave request
	}
	return &engineState{st: next, vault: s.vault}, pi, nil
}

// removeTarget returns the leaf a Remove proposal removes. The engine has
// already authenticated the message; this only reads its body.
func removeTarget(msg []byte) (uint32, bool) {
	m, err := framing.UnmarshalMLSMessage(msg)
	if err != nil {
		return 0, false
	}
	pm, ok := m.AsPublic()
	if !ok {
		return 0, false
	}
	data, ok := pm.Content.ProposalData()
	if !ok {
		return 0, false
	}
	p, err := group.UnmarshalProposal(data)
	if err != nil || p.Type != group.ProposalTypeRemove || p.Remove == nil {
		return 0, false
	}
	return uint32(p.Remove.Removed), true
}

func (s *engineState) Decrypt(_ context.Context, msg []byte) (AppMessage, error) {
	a, err := s.st.Decrypt(msg)
	if err != nil {
		return AppMessage{}, err
	}
	return AppMessage{Sender: Leaf{InboxID: a.Sender.InboxID, InstallationKey: a.Sender.InstallationKey}, Plaintext: a.Payload}, nil
}
