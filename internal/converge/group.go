package converge

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"iter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/converge/project"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// input is one protocol input of a group, as FABRIC_IN stores it.
type input struct {
	// Seq is the FABRIC_IN stream sequence.
	Seq       uint64
	Class     schema.InputClass
	MessageID []byte
	Data      []byte
	// Time is when the stream stored the input (unix ms): the same on
	// every delivery, so expiry decisions replay identically.
	Time int64
}

// emission is one event of a transaction, for one client, with what makes
// its id: the cause (an input's message id, or an expiry) and its index
// among the events that cause made for that client.
type emission struct {
	Client string
	Cause  []byte
	Index  int
	Event  *project.Event
}

// emissions are a transaction's events in order, held in blocks: a
// transaction of a 100-member group emits thousands, and growing one slice
// of them by append copied each several times (6 % of that group's CPU
// profile, its garbage collection aside).
type emissions struct {
	blocks [][]emission
	n      int
}

// maxEmissionBlock bounds a block; the first ones are smaller, for the
// transactions of a small group.
const maxEmissionBlock = 256

func (e *emissions) add(x emission) {
	if k := len(e.blocks); k == 0 || len(e.blocks[k-1]) == cap(e.blocks[k-1]) {
		e.blocks = append(e.blocks, make([]emission, 0, min(max(e.n, 8), maxEmissionBlock)))
	}
	b := &e.blocks[len(e.blocks)-1]
	*b = append(*b, x)
	e.n++
}

func (e *emissions) len() int { return e.n }

// all yields every emission in order.
func (e *emissions) all() iter.Seq[*emission] {
	return func(yield func(*emission) bool) {
		for _, b := range e.blocks {
			for i := range b {
				if !yield(&b[i]) {
					return
				}
			}
		}
	}
}

// eventID is the id of the index-th event a cause made for a client:
// deterministic, so a retried transaction emits the same ids (EVENT-001).
func eventID(tenant, client string, cause []byte, index int) string {
	var idx [8]byte
	binary.BigEndian.PutUint64(idx[:], uint64(index))
	return bus.EventID([]byte(tenant), []byte(client), cause, idx[:])
}

// txn is one transaction over one group: the input it applies, the state
// it produces, and what it emits. Nothing is visible until the worker commits it.
type txn struct {
	tenant  string
	g       *groupState
	members map[string]MemberState // engine states of active members
	dirty   map[string]bool        // members whose engine state changed epoch or proposals
	ratchet map[string]bool        // members whose only change is a decryption ratchet
	events  emissions
	next    map[string]map[string]int // next event index by cause, then client
	notes   []outcomeNote
	// consumed are the KeyPackages this transaction's joins used.
	consumed []consumedKeyPackage
	now      int64 // emission time (unix ms), for expiry decisions
	// inputSeq is the stream sequence of the last input applied, 0 for a
	// transaction of no input (a cleanup pass); name names the
	// transaction in its checkpoint.
	inputSeq uint64
	name     string
	// groupChanged is set when hosted membership, components or keys
	// changed, so the group's fabric-groups and fabric-group-keys entries
	// are written again.
	groupChanged bool
	// chunks are the settled chunks stored for each member, brought up
	// to date by prepare.
	chunks map[string][]storedChunk
	// ix are the transaction's changes of the message index (index.go);
	// read reads the stored index, and err is the first read that failed:
	// the transaction fails with it.
	ix      indexWrites
	read    func(id []byte) (*storedMessage, error)
	fetched map[string]*storedMessage // stored entries prefetched
	err     error
	// rd are the transaction's readable records (readable.go).
	rd readWrites

	// out are the outbound messages and operation records the
	// transaction's operations made, stored in its fenced batch
	// (operate.go).
	out []*nats.Msg

	mls MLS
	dir directory
}

// directory finds hosted clients.
type directory interface {
	// ByKeyPackage returns the client id a KeyPackageRef (lowercase hex)
	// belongs to, or ok false when no hosted client has it.
	ByKeyPackage(ctx context.Context, tenant, refHex string) (clientID string, ok bool, err error)
	// Client returns a hosted client.
	Client(ctx context.Context, tenant, clientID string) (Client, error)
}

// policy decides how input advances a group's canonical state: marmot
// selects one canonical branch per hosted member with Marmot convergence
// (marmot.go) on the txn.
type policy interface {
	// run applies one input and whatever it makes processable, recording
	// an outcome note for every input whose outcome it decides.
	run(ctx context.Context, t *txn, in input) error
	// tick does the work that is due without input at t.now (a
	// convergence pass) and reports whether it changed anything.
	tick(ctx context.Context, t *txn) (bool, error)
	// selfUpdates runs the self-updates due at t.now (a member's leaf
	// older than period) and reports whether it ran any.
	selfUpdates(ctx context.Context, t *txn, period time.Duration) (bool, error)
	// fail records an input's terminal failure instead of applying it
	// (failinput.go).
	fail(t *txn, in input, why inputFailure) error
}

// emit records the events one cause made for one client, in kind-table
// order (EVENT-012), numbering them after any the cause already made.
func (t *txn) emit(client string, cause []byte, evs ...project.Event) {
	project.Order(evs)
	ptrs := make([]*project.Event, len(evs))
	for i := range evs {
		ptrs[i] = &evs[i]
	}
	t.emitOrdered(client, cause, ptrs...)
}

// emitOrdered records events already in kind-table order. They may be
// shared with other clients' emissions (a message's recipients): nothing
// changes an event once emitted.
func (t *txn) emitOrdered(client string, cause []byte, evs ...*project.Event) {
	if len(evs) == 0 {
		return
	}
	if t.next == nil {
		t.next = map[string]map[string]int{}
	}
	next := t.next[string(cause)]
	if next == nil {
		next = map[string]int{}
		t.next[string(cause)] = next
	}
	for _, ev := range evs {
		t.events.add(emission{Client: client, Cause: cause, Index: next[client], Event: ev})
		next[client]++
	}
	t.rd.touch(client)
}

func (t *txn) components() components.Set { return t.g.components() }

// components decodes the canonical components; a group without them, or
// with ones that no longer decode, has none.
func (g *groupState) components() components.Set {
	if g.Components == nil {
		return components.Set{}
	}
	s, err := components.Decode(g.Components)
	if err != nil {
		return components.Set{}
	}
	return s
}

func (t *txn) setComponents(s components.Set) {
	if b, err := components.Encode(s); err == nil {
		t.g.Components = b
	}
}

// welcome joins every hosted client the Welcome is addressed to (JOIN-045):
// into the group's view with only its keys when the view holds the
// Welcome's epoch (joinView), else in full. It calls adopt after each
// join, telling whether it was key-only.
func (t *txn) welcome(ctx context.Context, in input, adopt func(client string, keyOnly bool) error) (outcomeNote, bool, error) {
	at := in.Time
	refs, err := t.mls.WelcomeRefs(in.Data)
	if err != nil {
		note := rejectedNote(in.MessageID, in.Class, categoryOr(err, schema.CategoryInvalidEncoding), at)
		note.Reason = engine.ReasonOf(err)
		return note, false, nil
	}
	// A Welcome no hosted client joins says why in its outcome record
	// (docs/interop.md): a foreign peer sees the category alone otherwise.
	cat, reason := schema.CategoryWrongRecipient, "no hosted client waits for this Welcome: it names no KeyPackage of one, or the client holds the group already"
	joined := false
	for _, ref := range refs {
		clientID, ok, err := t.dir.ByKeyPackage(ctx, t.tenant, hex.EncodeToString(ref))
		if err != nil {
			return outcomeNote{}, false, err
		}
		if !ok {
			continue
		}
		if m := t.g.Members[clientID]; m != nil && !m.Removed {
			// JOIN step 9: a group already held is not joined again.
			continue
		}
		c, err := t.dir.Client(ctx, t.tenant, clientID)
		if err != nil {
			return outcomeNote{}, false, err
		}
		info, inView, err := t.joinView(ctx, c, in.Data)
		var st MemberState
		if err == nil && !inView {
			st, info, err = t.mls.Join(ctx, c, in.Data)
		}
		if err != nil {
			cat, reason = categoryOr(err, schema.CategoryInvalidEncoding), engine.ReasonOf(err)
			continue
		}
		if !bytes.Equal(info.GroupID, t.g.GroupID) {
			cat, reason = schema.CategoryWrongRecipient, "the Welcome's GroupInfo names another group than the transport message"
			continue
		}
		t.g.host(&hostedMember{ClientID: clientID, InboxID: c.InboxID, Installation: c.InstallationKey, JoinedSeq: in.Seq, Adder: info.AdderInboxID, FirstN: t.g.Delivered + 1})
		if st != nil {
			t.members[clientID] = st
			t.dirty[clientID] = true
		} else {
			delete(t.members, clientID) // its keys are in the view
		}
		comps := info.Components
		if info.Epoch >= t.g.Epoch || t.g.Components == nil {
			t.g.Epoch = info.Epoch
			t.setComponents(comps)
		}
		t.groupChanged = true // settle records the new member's keys
		t.emit(clientID, in.MessageID, project.Joined(t.g.GroupID, comps, schema.OriginWelcomed, info.AdderInboxID))
		if info.KeyPackageRef != nil {
			t.consumed = append(t.consumed, consumedKeyPackage{ClientID: clientID, Ref: info.KeyPackageRef})
		}
		if err := adopt(clientID, inView); err != nil {
			return outcomeNote{}, false, err
		}
		joined = true
	}
	if !joined {
		note := rejectedNote(in.MessageID, in.Class, cat, at)
		note.Reason = reason
		return note, false, nil
	}
	return accepted(in.MessageID, in.Class, at), true, nil
}

// joinView joins client c into the group's view with only its keys
// (MLS.JoinView) when the view holds the Welcome's epoch; false when there
// is no view yet or it does not: the caller joins in full.
func (t *txn) joinView(ctx context.Context, c Client, welcome []byte) (Joined, bool, error) {
	b, _ := t.members[sharedKey].(*branchState)
	if b == nil || b.cg.Tip() == nil {
		return Joined{}, false, nil
	}
	info, ok, err := t.mls.JoinView(ctx, c, welcome, b.cg)
	if ok {
		t.dirty[sharedKey] = true
	}
	return info, ok, err
}

// deliver indexes an application message stored at (seq, at) and gives
// every active member that opened it, but its sender installation, its
// message.received and the deletion it applies, as events of cause. The
// sender installation, when hosted, gets the message.deleted of the
// deletion it sent: it applies it too (the kind table's message.deleted,
// PROC-037; issue 26), though it gets no message.received of its own
// message and cannot open its own echo.
func (t *txn) deliver(id, cause []byte, seq uint64, at int64, app AppMessage, opened func(*hostedMember) bool) {
	comps := t.components()
	msg := storedMessage{ID: id, SenderInboxID: app.Sender.InboxID, SenderInstallation: app.Sender.InstallationKey, Seq: seq}
	var secs uint64
	if comps.Retention != nil && comps.Retention.DisappearingSecs > 0 {
		secs = uint64(comps.Retention.DisappearingSecs)
		msg.ExpiresAt = at + int64(secs)*1000 // META-050
	}
	var ct *schema.ContentTypeID
	var refID, target []byte
	if p, err := apppayload.Decode(app.Plaintext); err == nil {
		ct = &schema.ContentTypeID{AuthorityID: p.ContentType.AuthorityID, TypeID: p.ContentType.TypeID, VersionMajor: p.ContentType.VersionMajor}
		if id, _, ok := p.References(); ok {
			refID = id
		}
		if id, ok := p.DeletionTarget(); ok {
			target = id
		}
	}
	// PROC-037 / CTYPE-018: a deletion applies to a stored message of the
	// same sender inbox, or by an admin.
	var deleted *storedMessage
	if s := t.message(target); s != nil &&
		(s.SenderInboxID == app.Sender.InboxID || components.IsAdmin(comps, app.Sender.InboxID)) {
		deleted = s
	}
	// EVENT-021: a message deleted or expired is no longer held: it has
	// no entry.
	ref := t.message(refID)
	// One event for every recipient (the sender is none), shared by all
	// of them, so it is encoded once (bus.Batch).
	var received, receivedOwn, deletion *project.Event
	if ev, ok := project.Received(t.g.GroupID, project.Member{}, project.Message{
		ID: id, SenderInboxID: app.Sender.InboxID, SenderInstallation: app.Sender.InstallationKey,
		ContentType: ct, ExpiresAt: msg.ExpiresAt,
	}, t.now); ok {
		own := ev
		own.ReferencesOwn = true
		received, receivedOwn = &ev, &own
	}
	if deleted != nil {
		ev := project.Deleted(t.g.GroupID, deleted.ID)
		deletion = &ev
	}
	evs := make([]*project.Event, 0, 2)
	for _, m := range t.g.active() {
		evs = evs[:0]
		if bytes.Equal(m.Installation, app.Sender.InstallationKey) {
			if deletion != nil && m.holds(deleted) {
				t.emitOrdered(m.ClientID, cause, deletion)
			}
			continue
		}
		if !opened(m) {
			continue
		}
		switch {
		case received == nil:
		case ref != nil && ref.SenderInboxID == m.InboxID && m.holds(ref): // EVENT-021
			evs = append(evs, receivedOwn)
		default:
			evs = append(evs, received)
		}
		if deletion != nil && m.holds(deleted) {
			evs = append(evs, deletion) // message.deleted follows message.received (EVENT-012)
		}
		t.emitOrdered(m.ClientID, cause, evs...)
	}
	if deleted != nil {
		t.retire(deleted, readmodel.StateDeleted, app.Sender.InboxID)
		t.unindex(deleted.ID)
	}
	t.g.Delivered++
	msg.N, msg.At = t.g.Delivered, at
	t.record(msg, ct, app.Plaintext)
	t.index(msg, secs)
}

// categoryOr returns the category an engine error carries, or def.
func categoryOr(err error, def schema.Category) schema.Category {
	if c := engine.CategoryOf(err); c != "" {
		return c
	}
	var ce interface{ Category() schema.Category }
	if errors.As(err, &ce) {
		return ce.Category()
	}
	return def
}

func rejectableCategory(c schema.Category) bool {
	switch c {
	case schema.CategoryDuplicate, schema.CategoryOwnEcho, schema.CategoryWrongRecipient, schema.CategoryUnknownGroup,
		schema.CategoryInvalidEncoding, schema.CategoryInvalidSignature, schema.CategoryUnsupportedRequiredFeature,
		schema.CategoryAuthorizationFailed, schema.CategoryResourceRefused:
		return true
	}
	return false
}
