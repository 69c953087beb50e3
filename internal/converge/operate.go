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
	// MessageIDs are what the operation produced (each attempt's commit,
	// then its Welcomes), named again in its records.
	MessageIDs [][]byte `msgpack:"message_ids"`
	// Epoch is the commit's parent epoch; Lost is set once the canonical
	// state moved past it without the commit and no attempt is left: the
	// operation was reported failed, and is reported done should the
	// commit still win.
	Epoch uint64 `msgpack:"epoch"`
	Lost  bool   `msgpack:"lost,omitempty"`
	// Intent is what the operation asks, made again on the canonical
	// state when the commit loses; Attempts counts the commits made for
	// it. A state written before retries has no intent: its lost commit
	// fails the operation.
	Intent   *commitIntent `msgpack:"intent,omitempty"`
	Attempts int           `msgpack:"attempts,omitempty"`
	// Retrying is set once the commit lost: its intent waits for its
	// retry or is retried. The client's new commit operations wait until
	// it settles (retrying), so they cannot make it lose again.
	Retrying bool `msgpack:"retrying,omitempty"`
}

// waitingOp is an operation input that waits, in the group's state, for
// its client's own commit to settle.
type waitingOp struct {
	ClientID  string `msgpack:"client_id"`
	Seq       uint64 `msgpack:"seq"`
	MessageID []byte `msgpack:"message_id"`
	Data      []byte `msgpack:"data"`
	Time      int64  `msgpack:"time"`
}

// commitIntent is an operation's change of the group, from which each
// attempt's commit is made on the state it is made on.
type commitIntent struct {
	// Kind is the change: add_members (a create's adds too),
	// remove_member, update_conversation or self_update.
	Kind        schema.OperationKind `msgpack:"kind"`
	KeyPackages [][]byte             `msgpack:"key_packages,omitempty"`
	InboxID     string               `msgpack:"inbox_id,omitempty"`
	Patch       *bus.ComponentsPatch `msgpack:"patch,omitempty"`
}

// maxOwnCommits bounds the own commits a group state waits for; an older
// one's operation stays pending.
const maxOwnCommits = 64

// maxCommitAttempts bounds the commits made for one operation: an
// operation whose last commit also loses fails with stale_epoch.
const maxCommitAttempts = 3

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

// errNoState: the client's canonical state of the group is lost.
var errNoState = errors.New("the client's state of the group did not restore")

// errGroupExists: a create names a group the fabric already holds.
var errGroupExists = errors.New("group exists")

// operate executes one operation (issue 19) in the transaction of its
// input: what it sends is stored on fabric.out.<tenant>.<group>, and its
// record on fabric.op.<tenant>.<operation_id>, in the transaction's fenced
// batch with the state it leaves, so it is sent exactly once. A refused
// operation sends nothing; its record says why. A send or leave request of
// a client whose own commit is pending waits for it (wait).
func (p marmot) operate(ctx context.Context, t *txn, in input) error {
	req, err := bus.DecodeOperation(in.Data)
	if err != nil || !bytes.Equal(req.GroupID, t.g.GroupID) {
		// Nothing to answer: the API never stores such a request.
		return nil
	}
	if waits(req.Kind) && t.g.held(req.ClientID) || commits(req.Kind) && t.g.retryHeld(req.ClientID) {
		if err := t.wait(in, req, p.hooks.waitingBound()); err != nil {
			_, err = p.finish(t, in, req, "", nil, err)
			return err
		}
		return nil
	}
	status, ids, err := p.execute(ctx, t, in, req)
	if failed, err := p.finish(t, in, req, status, ids, err); failed || err != nil {
		return err
	}
	if err := p.settle(t); err != nil {
		return err
	}
	return p.sendWaiting(ctx, t)
}

// finish records what became of an operation: its status and what it
// sent, or, refused (failed true), its category.
func (p marmot) finish(t *txn, in input, req bus.OperationRequest, status schema.OperationStatus, ids [][]byte, err error) (failed bool, _ error) {
	at := time.UnixMilli(in.Time)
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
		return true, t.opRecord(rec)
	}
	if err != nil {
		return false, err
	}
	rec := req.Record(status, at)
	for _, id := range ids {
		rec.MessageIDs = append(rec.MessageIDs, schema.Bytes(id))
	}
	return false, t.opRecord(rec)
}

// Bounds of the operations a group's state keeps waiting for own commits:
// past either, an operation that would wait fails with resource_refused.
// A test lowers maxWaiting with hooks.maxWaiting.
const maxWaiting = 1024

const maxWaitingBytes = 8 << 20

// errTooManyWaiting: the group's state holds as many waiting operations as
// it keeps.
var errTooManyWaiting = errors.New("too many operations wait for own commits in the group")

// waits reports whether an operation of kind waits for its client's
// pending own commit: the ones that encrypt in the client's epoch without
// a commit (a send, a leave request). Marmot group state: while a local
// commit is pending, do not encrypt; queue. A message of the commit's
// parent epoch stored behind the commit reaches members that applied it
// (an mls-go peer then fails its signature), so it is made in the epoch
// the commit makes, or, when the commit finally fails, on the canonical
// state. A commit operation does not wait: it races and is retried
// (ownCommitOutcomes), except behind its client's retry (retryHeld).
func waits(kind schema.OperationKind) bool {
	return kind == schema.OpSendMessage || kind == schema.OpLeave
}

// commits reports whether an operation of kind commits in an existing
// group. Such an operation races the client's other commits and is retried
// when it loses, except behind a retry of the same client (retryHeld).
func commits(kind schema.OperationKind) bool {
	switch kind {
	case schema.OpAddMembers, schema.OpRemoveMember, schema.OpUpdateConversation, schema.OpSelfUpdate:
		return true
	}
	return false
}

// retryHeld reports whether a client's commit operation waits: a lost
// commit of the client waits for its retry or is retried, or an earlier
// operation of it waits still. A retried commit that raced the client's
// newer commits could lose to them on every attempt and fail while nothing
// but its own client competed (issue 26 chaos: a rename failed stale_epoch
// after three losses to later renames).
func (g *groupState) retryHeld(clientID string) bool {
	return slices.ContainsFunc(g.OwnCommits, func(oc ownCommit) bool { return oc.ClientID == clientID && !oc.Lost && oc.Retrying }) ||
		slices.ContainsFunc(g.Waiting, func(w waitingOp) bool { return w.ClientID == clientID })
}

// pending reports whether an own commit of a client is not settled yet: on
// its way back, or lost and waiting for its retry.
func (g *groupState) pending(clientID string) bool {
	return slices.ContainsFunc(g.OwnCommits, func(oc ownCommit) bool { return oc.ClientID == clientID && !oc.Lost })
}

// held reports whether a client's send or leave request waits: an own
// commit of it is pending, or an earlier operation of it waits still (the
// client's operations keep their order).
func (g *groupState) held(clientID string) bool {
	return g.pending(clientID) || slices.ContainsFunc(g.Waiting, func(w waitingOp) bool { return w.ClientID == clientID })
}

// wait keeps an operation's input in the group's state until its client's
// own commit settles. Its record stays queued. Stored with the state, in
// the transaction's fenced batch like everything else, a waiting operation
// is neither lost nor repeated by a crash.
func (t *txn) wait(in input, req bus.OperationRequest, bound int) error {
	size := len(in.Data)
	for _, w := range t.g.Waiting {
		size += len(w.Data)
	}
	if len(t.g.Waiting) >= bound || size > maxWaitingBytes {
		return refuse(schema.CategoryResourceRefused, errTooManyWaiting)
	}
	t.g.Waiting = append(t.g.Waiting, waitingOp{ClientID: req.ClientID, Seq: in.Seq, MessageID: in.MessageID, Data: in.Data, Time: in.Time})
	return nil
}

// sendWaiting executes, in input order, the waiting operations of every
// client whose own commit is settled, on its canonical state: in the epoch
// its accepted commit made, or, when the commit finally failed, in the
// epoch the client holds. In the transaction that settled the commit, so
// they are stored with it, exactly once.
func (p marmot) sendWaiting(ctx context.Context, t *txn) error {
	if len(t.g.Waiting) == 0 {
		return nil
	}
	waiting := t.g.Waiting
	t.g.Waiting = nil
	for _, w := range waiting {
		if t.g.pending(w.ClientID) {
			t.g.Waiting = append(t.g.Waiting, w)
			continue
		}
		req, err := bus.DecodeOperation(w.Data)
		if err != nil {
			continue // decoded when it began to wait
		}
		in := input{Seq: w.Seq, Class: bus.ClassOperation, MessageID: w.MessageID, Data: w.Data, Time: w.Time}
		status, ids, err := p.execute(ctx, t, in, req)
		if _, err := p.finish(t, in, req, status, ids, err); err != nil {
			return err
		}
	}
	return nil
}

// execute runs the operation for its client and returns its status and the
// ids of what it sent.
func (p marmot) execute(ctx context.Context, t *txn, in input, req bus.OperationRequest) (schema.OperationStatus, [][]byte, error) {
	c, inst, err := p.installation(ctx, t, req.ClientID)
	if err != nil {
		return "", nil, err
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
	m, cg, key, err := p.member(t, req.ClientID)
	if err != nil {
		return "", nil, err
	}
	switch kind {
	case schema.OpSendMessage:
		return p.send(t, in, req, m, cg, inst, key)
	case schema.OpLeave:
		st, err := cg.StateOf(m.ClientID)
		if err != nil {
			return "", nil, err
		}
		msg, err := st.Leave(inst)
		if err != nil {
			return "", nil, refuse(categoryOr(err, schema.CategoryInvalidEncoding), err)
		}
		id, err := t.outbound(req.ID, msg, schema.ClassProposal, &key)
		if err != nil {
			return "", nil, err
		}
		return schema.OperationDone, [][]byte{id}, nil
	}
	oc := ownCommit{OperationID: req.ID, ClientID: req.ClientID, Kind: req.Kind,
		Intent: &commitIntent{Kind: kind, KeyPackages: req.KeyPackages, InboxID: req.InboxID, Patch: req.Patch}}
	cr, err := commitRequest(cg, *oc.Intent, false)
	if err != nil {
		return "", nil, err
	}
	ids, err := p.commit(t, oc, cr, m, cg, inst, key)
	if err != nil {
		return "", nil, err
	}
	return schema.OperationPending, ids, nil
}

// installation opens a hosted client's installation.
func (p marmot) installation(ctx context.Context, t *txn, clientID string) (Client, *engine.Installation, error) {
	c, err := t.dir.Client(ctx, t.tenant, clientID)
	if errors.Is(err, clientstore.ErrNotFound) {
		return Client{}, nil, refuse(schema.CategoryWrongRecipient, err)
	}
	if err != nil {
		return Client{}, nil, err
	}
	inst, err := p.vault.Open(c.Sealed)
	if err != nil {
		return Client{}, nil, fmt.Errorf("open installation: %w", err)
	}
	return c, inst, nil
}

// member returns a client's active membership, its convergence state and
// the group event key of its canonical state.
func (p marmot) member(t *txn, clientID string) (*hostedMember, *convergence.Group, [binding.KeySize]byte, error) {
	var key [binding.KeySize]byte
	m := t.g.Members[clientID]
	if m == nil || m.Removed {
		return nil, nil, key, refuse(schema.CategoryUnknownGroup, errNotMember)
	}
	cg, err := p.view(t)
	if err != nil {
		return nil, nil, key, err
	}
	if cg.Tip() == nil || !hosts(cg, clientID) {
		// Its canonical state did not restore (storage loss), or it waits
		// to join the view (view): the group is unrecoverable for it
		// (issue 26: never a panic).
		return nil, nil, key, refuse(schema.CategoryMissingHistory, errNoState)
	}
	key, err = cg.Tip().GroupEventKey()
	return m, cg, key, err
}

// commitRequest makes an intent's commit request on the member's
// canonical state. Made again after a lost commit (retry), it asks only
// what that state does not hold yet (Marmot convergence: the intent is
// regenerated on the selected branch): the KeyPackages of inboxes not yet
// members, a removal of an inbox still a member, a change of components
// that changes them; errNothingLeft when nothing is left to ask.
func commitRequest(cg *convergence.Group, in commitIntent, retry bool) (cr engine.CommitRequest, err error) {
	tip := cg.Tip()
	// Proposals the member's view holds (a leave request) go with the
	// commit, by reference.
	cr = engine.CommitRequest{Proposals: cg.TipProposals()}
	switch in.Kind {
	case schema.OpAddMembers:
		cr.Add = in.KeyPackages
		if retry {
			members := tip.InboxIDs()
			cr.Add = slices.DeleteFunc(slices.Clone(in.KeyPackages), func(kp []byte) bool {
				inbox, err := engine.KeyPackageInboxID(kp)
				return err == nil && slices.Contains(members, inbox)
			})
			if len(cr.Add) == 0 {
				return cr, errNothingLeft
			}
		}
	case schema.OpRemoveMember:
		if retry && !slices.Contains(tip.InboxIDs(), in.InboxID) {
			return cr, errNothingLeft
		}
		cr.Remove = []string{in.InboxID}
	case schema.OpUpdateConversation:
		set, _, err := tip.Components()
		if err != nil {
			return cr, err
		}
		next, err := applyPatch(set, in.Patch)
		if err != nil {
			return cr, refuse(schema.CategoryInvalidEncoding, err)
		}
		if retry {
			a, errA := components.Encode(set)
			b, errB := components.Encode(next)
			if errA == nil && errB == nil && bytes.Equal(a, b) {
				return cr, errNothingLeft
			}
		}
		cr.Components = &next
	}
	return cr, nil
}

// errNothingLeft: a lost commit's intent is held by the canonical state
// already; its operation is done without another commit.
var errNothingLeft = errors.New("the canonical state holds the intent")

// commit makes an own commit of cr on the member's canonical state, adds
// it and its Welcomes to the transaction's batch, and waits for its
// outcome as oc's next attempt. It returns the ids of what it sent.
func (p marmot) commit(t *txn, oc ownCommit, cr engine.CommitRequest, m *hostedMember, cg *convergence.Group, inst *engine.Installation, key [binding.KeySize]byte) ([][]byte, error) {
	// The view remembers the state that made it (docs/shared-state.md).
	out, err := cg.Commit(m.ClientID, inst, cr)
	if err != nil {
		return nil, refuse(categoryOr(err, schema.CategoryInvalidEncoding), err)
	}
	// The view now keeps the state that made the commit: written with this
	// transaction, so the commit applies when it comes back.
	t.dirty[sharedKey] = true
	id, err := t.outbound(oc.OperationID, out.Commit, schema.ClassCommit, &key)
	if err != nil {
		return nil, err
	}
	ids := [][]byte{id}
	for _, w := range out.Welcomes {
		// A joiner has no group event key yet: Welcomes go in the clear.
		wid, err := t.outbound(oc.OperationID, w, schema.ClassWelcome, nil)
		if err != nil {
			return nil, err
		}
		ids = append(ids, wid)
	}
	oc.CommitID, oc.Epoch, oc.Lost = id, cg.TipEpoch(), false
	oc.MessageIDs = append(slices.Clip(oc.MessageIDs), ids...)
	oc.Attempts++
	t.g.OwnCommits = append(t.g.OwnCommits, oc)
	if n := len(t.g.OwnCommits); n > maxOwnCommits {
		t.g.OwnCommits = slices.Delete(t.g.OwnCommits, 0, n-maxOwnCommits)
	}
	return ids, nil
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
	t.g.host(&hostedMember{ClientID: c.ClientID, InboxID: c.InboxID, Installation: c.InstallationKey, JoinedSeq: in.Seq})
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
	// On the tip's one secret tree: a generation is never reused (RFC 9420
	// §9.1, docs/shared-state.md).
	msg, err := cg.Encrypt(m.ClientID, inst, req.Payload)
	if err != nil {
		return "", nil, refuse(categoryOr(err, schema.CategoryInvalidEncoding), err)
	}
	// The ratchet advanced: a view written later could encrypt again
	// under the used key, so it is written with this transaction.
	t.dirty[sharedKey] = true
	id, err := t.outbound(req.ID, msg, schema.ClassApplication, &key)
	if err != nil {
		return "", nil, err
	}
	// The status goes first: a deletion delivered now adds the
	// sender's message.deleted after it (EVENT-012, kind-table order).
	t.emit(m.ClientID, req.ID, project.StatusChanged(t.g.GroupID, id, schema.StatusUnpublished, schema.StatusPublished))
	// The group's other hosted members get it now (deliverOwn).
	if err := p.deliverOwn(t, in, m, id, msg, req.Payload, req.ID); err != nil {
		return "", nil, err
	}
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
// transaction settled: accepted on the canonical branch is done; rejected
// is failed with the outcome's category. A commit not accepted while the
// canonical state moved past its parent epoch (or stale) lost a race to a
// competing commit: its operation's intent is made again on the canonical
// state (retry), in this transaction, so the new commit is stored with the
// state that selected the winner, exactly once. After maxCommitAttempts,
// or when the new state refuses the intent (authorization_failed when the
// winner took the client's admin rights), the operation is failed; its
// last commit may still win inside the rollback horizon, and then the
// operation is done. The sends and leave requests that waited for a
// settled commit are then executed (sendWaiting).
func (p marmot) ownCommitOutcomes(ctx context.Context, t *txn) error {
	lost, err := p.supersededOwnCommits(t)
	if err != nil {
		return err
	}
	if len(t.g.OwnCommits) == 0 && len(lost) == 0 {
		return p.sendWaiting(ctx, t)
	}
	// Each commit's last outcome in this input. The commits it accepted
	// are settled: none is in flight for a commit waiting behind it
	// (newerOf).
	notes := make([]*outcomeNote, len(t.g.OwnCommits))
	var inFlight []ownCommit
	for i, oc := range t.g.OwnCommits {
		for j := range t.notes {
			if bytes.Equal(t.notes[j].MessageID, oc.CommitID) {
				notes[i] = &t.notes[j]
			}
		}
		if notes[i] == nil || notes[i].Disposition != schema.DispositionAccepted {
			inFlight = append(inFlight, oc)
		}
	}
	var keep []ownCommit
	for i, oc := range t.g.OwnCommits {
		note := notes[i]
		// The committer's canonical state: the view's tip while it is a
		// member.
		epoch, holds, err := p.tipEpoch(t, oc.ClientID)
		if err != nil {
			return err
		}
		rec := t.ownRecord(oc, schema.OperationDone)
		stale := note != nil && note.Disposition == schema.DispositionStale
		switch {
		case note != nil && note.Disposition == schema.DispositionAccepted && !oc.Lost && newerOf(inFlight, oc):
			// A lost commit waiting behind its client's retried one won
			// for now, but the retried one, already sent on the state it
			// lost to, extends that branch and wins back when it comes.
			// It is settled after that one, like any waiting commit: made
			// again on the canonical state, done without a commit when
			// that holds its intent.
			keep = append(keep, oc)
			continue
		case note != nil && note.Disposition == schema.DispositionAccepted:
			if m := t.g.Members[oc.ClientID]; m != nil {
				m.LeafAt = t.now // the commit carried the committer's new path
			}
			t.g.watchAccepted(oc)
		case !oc.Lost && (stale || !holds || epoch > oc.Epoch):
			lost = append(lost, oc)
			continue
		case note != nil && note.Disposition != schema.DispositionDeferred:
			rec.Status, rec.Category = schema.OperationFailed, note.Category
			if rec.Category == "" {
				rec.Category = schema.CategoryStaleEpoch
			}
		default:
			keep = append(keep, oc)
			continue
		}
		if err := t.opRecord(rec); err != nil {
			return err
		}
	}
	t.g.OwnCommits = keep
	for _, oc := range lost {
		oc.Retrying = true
		// One commit of a client at a time: the intent of a second lost
		// one is made again once the first is settled, on the state after
		// it, so the two do not race again.
		if slices.ContainsFunc(t.g.OwnCommits, func(o ownCommit) bool { return o.ClientID == oc.ClientID && !o.Lost }) {
			t.g.OwnCommits = append(t.g.OwnCommits, oc)
			continue
		}
		if err := p.retry(ctx, t, oc); err != nil {
			return err
		}
	}
	return p.sendWaiting(ctx, t)
}

// newerOf reports whether oc's client has a commit in flight made on a
// later epoch than oc: oc lost and waits behind it.
func newerOf(own []ownCommit, oc ownCommit) bool {
	return slices.ContainsFunc(own, func(o ownCommit) bool { return o.ClientID == oc.ClientID && !o.Lost && o.Epoch > oc.Epoch })
}

// tipEpoch is the epoch of a client's canonical state; holds is false when
// it holds none (removed).
func (p marmot) tipEpoch(t *txn, clientID string) (epoch uint64, holds bool, err error) {
	m := t.g.Members[clientID]
	if m == nil || m.Removed {
		return 0, false, nil
	}
	cg, err := p.view(t)
	if err != nil {
		return 0, false, err
	}
	return cg.TipEpoch(), true, nil
}

// retry makes a lost commit's intent again on the client's canonical
// state and records what became of its operation: pending with the new
// commit, done when the state holds the intent already, or failed.
func (p marmot) retry(ctx context.Context, t *txn, oc ownCommit) error {
	if oc.Intent == nil || oc.Attempts >= maxCommitAttempts {
		oc.Lost = true
		t.g.OwnCommits = append(t.g.OwnCommits, oc)
		rec := t.ownRecord(oc, schema.OperationFailed)
		rec.Category = schema.CategoryStaleEpoch
		return t.opRecord(rec)
	}
	err := func() error {
		_, inst, err := p.installation(ctx, t, oc.ClientID)
		if err != nil {
			return err
		}
		m, cg, key, err := p.member(t, oc.ClientID)
		if err != nil {
			return err
		}
		cr, err := commitRequest(cg, *oc.Intent, true)
		if err != nil {
			return err
		}
		ids, err := p.commit(t, oc, cr, m, cg, inst, key)
		oc.MessageIDs = append(slices.Clip(oc.MessageIDs), ids...)
		return err
	}()
	rec := t.ownRecord(oc, schema.OperationPending)
	var f *operationFailure
	switch {
	case errors.Is(err, errNothingLeft):
		rec.Status = schema.OperationDone
	case errors.As(err, &f):
		rec.Status, rec.Category = schema.OperationFailed, f.cat
	case err != nil:
		return err
	}
	return t.opRecord(rec)
}

// ownRecord is the record of an own commit's operation with a status,
// naming what it sent.
func (t *txn) ownRecord(oc ownCommit, status schema.OperationStatus) schema.Operation {
	rec := schema.Operation{ID: oc.OperationID, Kind: oc.Kind, ClientID: oc.ClientID, GroupID: t.g.GroupID, Status: status, Time: time.UnixMilli(t.now).UTC()}
	for _, id := range oc.MessageIDs {
		rec.MessageIDs = append(rec.MessageIDs, schema.Bytes(id))
	}
	return rec
}
