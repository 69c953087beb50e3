package converge

import (
	"bytes"
	"slices"
	"time"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// deliverOwn gives a hosted client's own application message to the
// group's hosted members in the transaction that encrypted it (issue 26):
// the group's view admits it at once, so the other hosted
// members decrypt the sender's messages in the order it made them, and
// what they are told is stored in the same fenced batch as the message and
// the operation's record. A copy that comes back through ingest later,
// however late and in whatever order, is a duplicate in the view that
// admitted it here (admit): it is delivered nothing again. Before this,
// the other members decrypted the copy when it came back, and a copy
// redelivered behind newer ones could no longer be decrypted after a
// restart (a member's snapshot keeps no skipped ratchet keys).
//
// A member that joins after the send and before the copy comes back
// decrypts the copy then, as any member's message. The message's outcome
// record is written when the copy comes back, not here: written here,
// ingest would take the copy for a duplicate and such a member would never
// see it.
func (p marmot) deliverOwn(t *txn, in input, sender *hostedMember, id, msg, payload []byte, opID []byte) error {
	s := p.newStep(t)
	s.seq, s.at = in.Seq, in.Time
	// No pass is closed here: the operation's input did not close one
	// either, and the sender's message was made on the tip it found.
	now := time.UnixMilli(max(in.Time, t.g.LastTime))
	own := input{Seq: in.Seq, Class: schema.ClassApplication, MessageID: id, Data: msg, Time: in.Time}
	if _, err := p.admit(s, own, now, false); err != nil {
		return err
	}
	s.notes = slices.DeleteFunc(s.notes, func(n outcomeNote) bool { return bytes.Equal(n.MessageID, id) })
	s.finish()
	// The group holds its members' messages once one of them delivers it
	// (indexed, readable, a deletion applied); the sender is never its
	// recipient (own_echo), so a sender alone in the group delivers it now.
	alone := !slices.ContainsFunc(t.g.active(), func(o *hostedMember) bool { return o.ClientID != sender.ClientID })
	if alone {
		app := AppMessage{Sender: Leaf{InboxID: sender.InboxID, InstallationKey: sender.Installation}, Plaintext: payload}
		t.deliver(id, opID, in.Seq, in.Time, app, func(*hostedMember) bool { return false })
	}
	return nil
}
