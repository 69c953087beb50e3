package converge

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/binding"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/converge/project"
	"github.com/fabric-mls/fabric/internal/convergence"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// ownCommit is an own commit on the outbound stream whose operation waits
// for its outcome: accepted on the canonical branch, or not.
type ownCommit struct {
	CommitID    []byte               `msgpack:"commit_id"`
	OperationID []byte               `msgpack:"operation_id"`
	ClientID    string               `msgpack:"client_id"`
	Kind        schema.OperationKind `msgpack:"kind"`
	// MessageIDs are what the operation produced (the commit, then its
	// Welcomes), named again in its final record.
	MessageIDs [][]byte `msgpack:"message_ids"`
	// Epoch is the commit's parent epoch; Lost is set once the canonical
	// state moved past it without the commit: the operation was reported
	// failed, and is reported done should the commit still win.
	Epoch uint64 `msgpack:"epoch"`
	Lost  bool   `msgpack:"lost,omitempty"`
}

// maxOwnCommits bounds the own commits a group state waits for; an older
// one's operation stays pending.
const maxOwnCommits = 64

// operationFailure is an operation that fails with a category: nothing is
// sent, its record says why.
type operationFailure struct {
	cat schema.Category
	err error
}

func (f *operationFailure) Error() string {
	return fmt.Sprintf("operation refused (%s): %v", f.cat, f.err)
}
func (f *operationFailure) Unwrap() error { return f.err }

func refuse(cat schema.Category, err error) error { return &operationFailure{cat: cat, err: err} }

// errNotMember: the operation's client holds no active state of the group.
var errNotMember = errors.New("client is not an active member of the group")

// errGroupExists: a create names a group the fabric already holds.
var errGroupExists = errors.New("group exists")

// operate executes one operation (issue 19) in the transaction of its
// input: what it sends is stored on fabric.out.<tenant>.<group>, and its
// record on fabric.op.<tenant>.<operation_id>, in the transaction's fenced
// batch with the state it leaves, so it is sent exactly once. A refused
// operation sends nothing; its record says why.
func (p marmot) operate(ctx context.Context, t *txn, in input) error {
	at := time.UnixMilli(in.Time)
	req, err := bus.DecodeOperation(in.Data)
	if err != nil || !bytes.Equal(req.GroupID, t.g.GroupID) {
		// Nothing to answer: the API never stores such a request.
		return nil
	}
	status, ids, err := p.execute(ctx, t, in, req)
	var f *operationFailure
	if errors.As(err, &f) {
		rec := req.Record(schema.OperationFailed, at)
		rec.Category = f.cat
		if req.Kind == schema.OpSendMessage && !errors.Is(err, clientstore.ErrNotFound) {
			// SEND: the client's message failed. Refused before
			// encryption, it has no MLS message id: the operation id
			// names it, as the API's answer did; the record says why.
			t.emit(req.ClientID, req.ID, project.StatusChanged(t.g.GroupID, req.ID, schema.StatusUnpublished, schema.StatusFailed))
		}
		return t.opRecord(rec)
	}
	if err != nil {
		return err
	}
	rec := req.Record(status, at)
	for _, id := range ids {
		rec.MessageIDs = append(rec.MessageIDs, schema.Bytes(id))
	}
	if err := t.opRecord(rec); err != nil {
		return err
	}
	return p.settle(t)
}

// execute runs the operation for its client and returns its status and the
// ids of what it sent.
func (p marmot) execute(ctx context.Context, t *txn, in input, req bus.OperationRequest) (schema.OperationStatus, [][]byte, error) {
	c, err := t.dir.Client(ctx, t.tenant, req.ClientID)
	if errors.Is(err, clientstore.ErrNotFound) {
		return "", nil, refuse(schema.CategoryWrongRecipient, err)
	}
	if err != nil {
		return "", nil, err
	}
	inst, err := p.vault.Open(c.Sealed)
	if err != nil {
		return "", nil, fmt.Errorf("open installation: %w", err)
	}
	kind := req.Kind
	if kind == schema.OpCreateConversation {
		if err := p.create(t, in, req, c, inst); err != nil {
			return "", nil, err
		}
		if len(req.KeyPackages) == 0 {
			return schema.OperationDone, nil, nil
		}
		kind = schema.OpAddMembers // the members join by the commit that follows
	}
	m := t.g.Members[req.ClientID]
	if m == nil || m.Removed {
		return "", nil, refuse(schema.CategoryUnknownGroup, errNotMember)
	}
	cg, err := p.group(t, m)
	if err != nil {
		return "", nil, err
	}
	tip := cg.Tip()
	key, err := tip.GroupEventKey()
	if err != nil {
		return "", nil, err
	}
	switch kind {
	case schema.OpSendMessage:
		return p.send(t, in, req, m, cg, inst, key)
	case schema.OpLeave:
		msg, err := tip.Leave(inst)
		if err != nil {
			return "", nil, refuse(categoryOr(err, schema.CategoryInvalidEncoding), err)
		}
		id, err := t.outbound(req.ID, msg, schema.ClassProposal, &key)
		if err != nil {
			return "", nil, err
		}
		return schema.OperationDone, [][]byte{id}, nil
	}
	// Proposals the member's view holds (a leave request) go with the
	// commit, by reference.
	cr := engine.CommitRequest{Proposals: cg.TipProposals()}
	switch kind {
	case schema.OpAddMembers:
		cr.Add = req.KeyPackages
	case schema.OpRemoveMember:
		cr.Remove = []string{req.InboxID}
	case schema.OpUpdateConversation:
		set, _, err := tip.Components()
		if err != nil {
			return "", nil, err
		}
		if set, err = applyPatch(set, req.Patch); err != nil {
			return "", nil, refuse(schema.CategoryInvalidEncoding, err)
		}
		cr.Components = &set
	}
	out, err := tip.Commit(inst, cr)
	if err != nil {
		return "", nil, refuse(categoryOr(err, schema.CategoryInvalidEncoding), err)
	}
	// The tip now keeps the state after the commit: written with this
	// transaction, so the commit applies when it comes back.
	t.dirty[m.ClientID] = true
	id, err := t.outbound(req.ID, out.Commit, schema.ClassCommit, &key)
	if err != nil {
		return "", nil, err
	}
	ids := [][]byte{id}
	for _, w := range out.Welcomes {
		// A joiner has no group event key yet: Welcomes go in the clear.
		wid, err := t.outbound(req.ID, w, schema.ClassWelcome, nil)
		if err != nil {
			return "", nil, err
		}
		ids = append(ids, wid)
	}
	t.g.OwnCommits = append(t.g.OwnCommits, ownCommit{CommitID: id, OperationID: req.ID, ClientID: req.ClientID, Kind: req.Kind, MessageIDs: ids, Epoch: tip.Epoch()})
	if n := len(t.g.OwnCommits); n > maxOwnCommits {
		t.g.OwnCommits = slices.Delete(t.g.OwnCommits, 0, n-maxOwnCommits)
	}
	return schema.OperationPending, ids, nil
}

// applyPatch changes the components a patch names; the result must encode.
func applyPatch(set components.Set, p *bus.ComponentsPatch) (components.Set, error) {
	if p == nil {
		return set, nil
	}
	if p.Name != nil || p.Description != nil {
		prof := components.ProfileState{}
		if set.Profile != nil {
			prof = *set.Profile
		}
		if p.Name != nil {
			prof.Name = *p.Name
		}
		if p.Description != nil {
			prof.Description = *p.Description
		}
		set.Profile = &prof
	}
	if p.ImageURL != nil {
		set.Avatar = &components.AvatarState{URL: *p.ImageURL}
	}
	if p.DisappearingSecs != nil {
		set.Retention = &components.RetentionState{DisappearingSecs: *p.DisappearingSecs}
	}
	if p.Admins != nil {
		set.Admins = nil
		for _, id := range p.Admins {
			a, err := components.ParseInboxID(id)
			if err != nil {
				return components.Set{}, err
			}
			set.Admins = append(set.Admins, a)
		}
		slices.SortFunc(set.Admins, func(a, b components.AccountID) int { return bytes.Compare(a[:], b[:]) })
		set.Admins = slices.Compact(set.Admins)
	}
	if _, err := components.Encode(set); err != nil {
		return components.Set{}, err
	}
	return set, nil
}

// create makes the group with the client as its only member
// (conversation.joined, origin created: EVENT-005).
func (p marmot) create(t *txn, in input, req bus.OperationRequest, c Client, inst *engine.Installation) error {
	if len(t.g.Members) > 0 {
		return refuse(schema.CategoryWrongRecipient, errGroupExists)
	}
	set := components.Set{}
	if len(req.Components) > 0 {
		var err error
		if set, err = components.Decode(req.Components); err != nil {
			return refuse(schema.CategoryInvalidEncoding, err)
		}
	}
	if set.Admins == nil {
		acct, err := components.ParseInboxID(c.InboxID)
		if err != nil {
			return refuse(schema.CategoryInvalidEncoding, err)
		}
		set.Admins = []components.AccountID{acct}
	}
	st, err := inst.CreateGroup(t.g.GroupID, set)
	if err != nil {
		return refuse(categoryOr(err, schema.CategoryInvalidEncoding), err)
	}
	t.g.Members[c.ClientID] = &hostedMember{ClientID: c.ClientID, InboxID: c.InboxID, Installation: c.InstallationKey, JoinedSeq: in.Seq}
	t.members[c.ClientID] = &engineState{st: st, vault: p.vault}
	t.dirty[c.ClientID] = true
	t.g.Epoch = st.Epoch()
	t.setComponents(set)
	t.groupChanged = true
	t.emit(c.ClientID, in.MessageID, project.Joined(t.g.GroupID, set, schema.OriginCreated, ""))
	return nil
}

// send encrypts the payload on the member's canonical state, stores the
// message on the outbound subject, and tells the client its status:
// published, from the fabric's own state. The client holds its own
// message (EVENT-021).
func (p marmot) send(t *txn, in input, req bus.OperationRequest, m *hostedMember, cg *convergence.Group, inst *engine.Installation, key [binding.KeySize]byte) (schema.OperationStatus, [][]byte, error) {
	msg, err := cg.Tip().Encrypt(inst, req.Payload)
	if err != nil {
		return "", nil, refuse(categoryOr(err, schema.CategoryInvalidEncoding), err)
	}
	// The ratchet advanced: a state written later could encrypt again
	// under the used key, so it is written with this transaction.
	t.dirty[m.ClientID] = true
	id, err := t.outbound(req.ID, msg, schema.ClassApplication, &key)
	if err != nil {
		return "", nil, err
	}
	// The group holds its members' messages once one of them delivers
	// it (deliver: indexed, readable, a deletion applied). Another hosted
	// member does when the message comes back as input; the sender gets
	// own_echo then, so a sender alone in the group delivers it now.
	alone := !slices.ContainsFunc(t.g.active(), func(o *hostedMember) bool { return o.ClientID != m.ClientID })
	if alone {
		own := AppMessage{Sender: Leaf{InboxID: m.InboxID, InstallationKey: m.Installation}, Plaintext: req.Payload}
		t.deliver(id, req.ID, in.Seq, in.Time, own, func(*hostedMember) bool { return false })
	}
	t.emit(m.ClientID, req.ID, project.StatusChanged(t.g.GroupID, id, schema.StatusUnpublished, schema.StatusPublished))
	return schema.OperationDone, [][]byte{id}, nil
}

// outbound adds an MLS message to the transaction's batch on
// fabric.out.<tenant>.<group>, as a fabric-native/1 transport message
// sealed under key (in the clear when key is nil), and returns its id.
func (t *txn) outbound(opID, mls []byte, class schema.InputClass, key *[binding.KeySize]byte) ([]byte, error) {
	id := engine.NewMessageID(mls)
	tm := schema.TransportMessage{V: schema.TransportVersion, Group: t.g.GroupID, Kind: schema.TransportMLS, Payload: mls}
	if key != nil {
		sealed, err := binding.Seal(*key, mls, rand.Reader)
		if err != nil {
			return nil, err
		}
		tm.Kind, tm.Payload = schema.TransportSealed, sealed
	}
	data, err := tm.MarshalMsgpack()
	if err != nil {
		return nil, err
	}
	subj, err := subject.Outbound(t.tenant, hex.EncodeToString(t.g.GroupID))
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(subj)
	msg.Data = data
	msg.Header.Set(bus.HeaderMessageID, hex.EncodeToString(id[:]))
	msg.Header.Set(bus.HeaderClass, string(class))
	msg.Header.Set(bus.HeaderOperationID, hex.EncodeToString(opID))
	t.out = append(t.out, msg)
	return id[:], nil
}

// opRecord adds an operation record to the transaction's batch.
func (t *txn) opRecord(rec schema.Operation) error {
	msg, err := bus.OperationRecordMsg(t.tenant, rec)
	if err != nil {
		return err
	}
	t.out = append(t.out, msg)
	return nil
}

// ownCommitOutcomes finishes the operations whose own commits the
// transaction settled: accepted on the canonical branch is done; stale or
// rejected is failed with the outcome's category. A commit still deferred
// while the canonical state moved past its parent epoch lost a race to a
// competing commit: its operation is failed with stale_epoch, not retried
// (the commit may still win inside the rollback horizon, and then the
// operation is done).
func (t *txn) ownCommitOutcomes() error {
	if len(t.g.OwnCommits) == 0 {
		return nil
	}
	keep := t.g.OwnCommits[:0]
	for _, oc := range t.g.OwnCommits {
		var note *outcomeNote
		for i := range t.notes {
			if bytes.Equal(t.notes[i].MessageID, oc.CommitID) {
				note = &t.notes[i]
			}
		}
		rec := schema.Operation{ID: oc.OperationID, Kind: oc.Kind, ClientID: oc.ClientID, GroupID: t.g.GroupID, Status: schema.OperationDone, Time: time.UnixMilli(t.now).UTC()}
		for _, id := range oc.MessageIDs {
			rec.MessageIDs = append(rec.MessageIDs, schema.Bytes(id))
		}
		switch {
		case note != nil && note.Disposition == schema.DispositionAccepted:
		case note != nil && note.Disposition != schema.DispositionDeferred:
			rec.Status, rec.Category = schema.OperationFailed, note.Category
			if rec.Category == "" {
				rec.Category = schema.CategoryStaleEpoch
			}
		case !oc.Lost && t.g.Epoch > oc.Epoch:
			oc.Lost = true
			rec.Status, rec.Category = schema.OperationFailed, schema.CategoryStaleEpoch
			keep = append(keep, oc)
		default:
			keep = append(keep, oc)
			continue
		}
		if err := t.opRecord(rec); err != nil {
			return err
		}
	}
	t.g.OwnCommits = keep
	return nil
}
