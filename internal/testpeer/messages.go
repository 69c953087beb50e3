package testpeer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/group"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/binding"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Send sends p as an application message (a PrivateMessage).
func (g *Group) Send(p apppayload.Payload) (Message, error) {
	if g.removed {
		return Message{}, ErrRemoved
	}
	b, err := apppayload.Encode(p)
	if err != nil {
		return Message{}, fmt.Errorf("testpeer %s: send: %w", g.peer.name, err)
	}
	pm, err := g.state.SendMessage(b, g.peer.sig)
	if err != nil {
		return Message{}, fmt.Errorf("testpeer %s: send: %w", g.peer.name, err)
	}
	return g.emit(framing.NewMLSMessagePrivate(pm).Marshal(), g.Epoch(), true)
}

// SendText sends an xmtp.org/text:1.0 message.
func (g *Group) SendText(text string) (Message, error) {
	return g.Send(apppayload.NewText(text))
}

// SendReply sends an xmtp.org/reply:1.0 with text, referencing message ref.
func (g *Group) SendReply(ref []byte, text string) (Message, error) {
	p, err := apppayload.NewReply(ref, apppayload.NewText(text))
	if err != nil {
		return Message{}, fmt.Errorf("testpeer %s: %w", g.peer.name, err)
	}
	return g.Send(p)
}

// SendReaction sends an xmtp.org/reaction:2.0 adding the unicode emoji to
// message ref.
func (g *Group) SendReaction(ref []byte, emoji string) (Message, error) {
	p, err := apppayload.NewReaction(apppayload.Reaction{
		Reference: ref,
		Action:    apppayload.ReactionAdded,
		Content:   emoji,
		Schema:    apppayload.SchemaUnicode,
	})
	if err != nil {
		return Message{}, fmt.Errorf("testpeer %s: %w", g.peer.name, err)
	}
	return g.Send(p)
}

// SendDelete sends an xmtp.org/deleteMessage:1.0 naming message target.
func (g *Group) SendDelete(target []byte) (Message, error) {
	p, err := apppayload.NewDeletion(target)
	if err != nil {
		return Message{}, fmt.Errorf("testpeer %s: %w", g.peer.name, err)
	}
	return g.Send(p)
}

// Kind says what a processed message was.
type Kind int

// Kinds of processed messages.
const (
	// KindOwn: the member's own output, skipped.
	KindOwn Kind = iota
	KindProposal
	KindCommit
	KindApplication
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case KindOwn:
		return "own"
	case KindProposal:
		return "proposal"
	case KindCommit:
		return "commit"
	case KindApplication:
		return "application"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Received is what Process made of a message.
type Received struct {
	Kind Kind
	// ID is the message id: SHA-256 of the peeled MLSMessage.
	ID []byte
	// Epoch is the epoch the message was sent in.
	Epoch uint64
	// SenderInboxID is the inbox of the authenticated MLS sender.
	SenderInboxID string
	// Payload is the decoded app payload of an application message.
	Payload apppayload.Payload
}

// ErrNotForGroup is returned by Process for a Welcome, a KeyPackage or a
// GroupInfo: Peer.Join takes Welcomes.
var ErrNotForGroup = errors.New("testpeer: message is not group traffic")

// Process applies a message another member produced: it peels the transport
// message (trying the retained group event keys when sealed), then processes
// a proposal or commit, or decrypts an application message and decodes its
// app payload. The member's own output is recognised and skipped.
func (g *Group) Process(msg schema.TransportMessage) (Received, error) {
	raw, err := binding.Peel(msg, g.EventKeys())
	if err != nil {
		return Received{}, fmt.Errorf("testpeer %s: process: %w", g.peer.name, err)
	}
	id := sha256.Sum256(raw)
	r := Received{ID: id[:]}
	if g.isOwn(r.ID) {
		return r, nil
	}
	if g.removed {
		return Received{}, fmt.Errorf("testpeer %s: process: %w", g.peer.name, ErrRemoved)
	}
	m, err := framing.UnmarshalMLSMessage(raw)
	if err != nil {
		return Received{}, fmt.Errorf("testpeer %s: process: %w", g.peer.name, err)
	}
	if pub, ok := m.AsPublic(); ok {
		return g.processPublic(pub, r)
	}
	if priv, ok := m.AsPrivate(); ok {
		return g.processPrivate(priv, r)
	}
	return Received{}, fmt.Errorf("testpeer %s: process: %w", g.peer.name, ErrNotForGroup)
}

func (g *Group) processPublic(pm *framing.PublicMessage, r Received) (Received, error) {
	r.Epoch = pm.Content.Epoch
	r.SenderInboxID = g.inboxAt(pm.Content.Sender.LeafIndex)
	switch pm.Content.ContentType() {
	case framing.ContentTypeProposal:
		r.Kind = KindProposal
	case framing.ContentTypeCommit:
		r.Kind = KindCommit
	default:
		return Received{}, fmt.Errorf("testpeer %s: process: public application message", g.peer.name)
	}
	if r.Kind == KindCommit {
		// mls-go cannot process a commit that removes the own leaf (it looks
		// for a path secret there), so authenticate it and stop.
		removes, err := g.commitRemovesSelf(pm)
		if err != nil {
			return Received{}, fmt.Errorf("testpeer %s: process commit: %w", g.peer.name, err)
		}
		if removes {
			if err := g.state.VerifyPublicMessage(pm); err != nil {
				return Received{}, fmt.Errorf("testpeer %s: process commit: %w", g.peer.name, err)
			}
			g.removed = true
			return r, nil
		}
	}
	if err := g.state.ProcessPublicMessage(pm); err != nil {
		return Received{}, fmt.Errorf("testpeer %s: process %s: %w", g.peer.name, r.Kind, err)
	}
	if r.Kind == KindCommit {
		if err := g.recordKey(); err != nil {
			return Received{}, err
		}
	}
	return r, nil
}

// commitRemovesSelf reports whether a commit removes the member's leaf, by
// an inline Remove or by reference to a stored Remove proposal.
func (g *Group) commitRemovesSelf(pm *framing.PublicMessage) (bool, error) {
	data, ok := pm.Content.CommitData()
	if !ok {
		return false, errors.New("commit without a commit body")
	}
	c, err := group.UnmarshalCommit(data)
	if err != nil {
		return false, err
	}
	self := g.state.OwnLeafIndex()
	removesSelf := func(p *group.Proposal) bool {
		return p != nil && p.Type == group.ProposalTypeRemove && p.Remove != nil && p.Remove.Removed == self
	}
	var selfRefs [][]byte
	if g.leaveRef != nil {
		selfRefs = append(selfRefs, g.leaveRef)
	}
	for _, sp := range g.state.StoredProposals() {
		if sp.Ref != nil && removesSelf(sp.Proposal) {
			selfRefs = append(selfRefs, sp.Ref)
		}
	}
	for _, por := range c.Proposals {
		if removesSelf(por.Proposal) {
			return true, nil
		}
		for _, ref := range selfRefs {
			if por.ProposalRef != nil && bytes.Equal(por.ProposalRef, ref) {
				return true, nil
			}
		}
	}
	return false, nil
}

func (g *Group) processPrivate(pm *framing.PrivateMessage, r Received) (Received, error) {
	r.Epoch = pm.Epoch
	if pm.ContentType != framing.ContentTypeApplication {
		return Received{}, fmt.Errorf("testpeer %s: process: private handshake message", g.peer.name)
	}
	r.Kind = KindApplication
	pt, _, leaf, err := g.state.ReceiveApplicationMessage(pm)
	if err != nil {
		return Received{}, fmt.Errorf("testpeer %s: process application: %w", g.peer.name, err)
	}
	r.SenderInboxID = g.inboxAt(uint32(leaf))
	if r.Payload, err = apppayload.Decode(pt); err != nil {
		return Received{}, fmt.Errorf("testpeer %s: process application: %w", g.peer.name, err)
	}
	return r, nil
}

func (g *Group) inboxAt(leaf uint32) string {
	m, ok := g.state.GetMember(group.LeafNodeIndex(leaf))
	if !ok || m == nil || m.Credential == nil {
		return ""
	}
	return hex.EncodeToString(m.Credential.Identity)
}
