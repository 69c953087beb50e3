package converge

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// operate stores an operation on its group's input subject, as the API
// does, and returns its id.
func (e *env) operate(req bus.OperationRequest) []byte {
	e.t.Helper()
	if req.ID == nil {
		req.ID = bus.OperationID(tenant, req.ClientID, fmt.Sprintf("%s-%d", req.Kind, time.Now().UnixNano()))
	}
	if req.GroupID == nil {
		req.GroupID = bus.OperationGroupID(req.ID)
	}
	data, err := bus.EncodeOperation(req)
	if err != nil {
		e.t.Fatal(err)
	}
	idHex := hex.EncodeToString(req.ID)
	subj, err := subject.Input(tenant, hex.EncodeToString(req.GroupID), idHex)
	if err != nil {
		e.t.Fatal(err)
	}
	msg := nats.NewMsg(subj)
	msg.Data = data
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	msg.Header.Set(bus.HeaderClass, string(bus.ClassOperation))
	msg.Header.Set(bus.HeaderMessageID, idHex)
	if _, err := e.js.PublishMsg(e.ctx, msg); err != nil {
		e.t.Fatal(err)
	}
	return req.ID
}

// operation waits for an operation's record to reach a final status
// (done or failed; pending when want says so) and returns it.
func (e *env) operation(id []byte, want schema.OperationStatus) schema.Operation {
	e.t.Helper()
	subj, err := subject.Operation(tenant, hex.EncodeToString(id))
	if err != nil {
		e.t.Fatal(err)
	}
	s, err := e.js.Stream(e.ctx, streams.StreamEvents)
	if err != nil {
		e.t.Fatal(err)
	}
	var rec schema.Operation
	eventually.NoError(e.t, func() error {
		m, err := s.GetLastMsgForSubject(e.ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("no operation record, want status %s", want)
		}
		if err != nil {
			e.t.Fatal(err)
		}
		if rec, err = bus.DecodeOperationRecord(m.Data); err != nil {
			e.t.Fatal(err)
		}
		if rec.Status != want {
			return fmt.Errorf("operation record %+v, want status %s", rec, want)
		}
		return nil
	})
	return rec
}

// outbound is what the fabric stored on a group's outbound subject, in
// order.
type outboundMsg struct {
	transport schema.TransportMessage
	id        string
	class     string
	opID      string
}

func (e *env) outboundMsgs(group []byte, n int) []outboundMsg {
	e.t.Helper()
	subj, err := subject.Outbound(tenant, hex.EncodeToString(group))
	if err != nil {
		e.t.Fatal(err)
	}
	var out []outboundMsg
	eventually.NoError(e.t, func() error {
		out = out[:0]
		for _, v := range e.stored(subj, func(m *jetstream.RawStreamMsg) (any, bool) {
			var tm schema.TransportMessage
			if err := tm.UnmarshalMsgpack(m.Data); err != nil {
				e.t.Fatal(err)
			}
			h := m.Header
			return outboundMsg{transport: tm, id: h.Get(bus.HeaderMessageID), class: h.Get(bus.HeaderClass), opID: h.Get(bus.HeaderOperationID)}, true
		}) {
			out = append(out, v.(outboundMsg))
		}
		if len(out) < n {
			return fmt.Errorf("%d outbound messages, want %d", len(out), n)
		}
		return nil
	})
	if len(out) != n {
		e.t.Fatalf("%d outbound messages, want %d", len(out), n)
	}
	return out
}

func textOf(t testing.TB, s string) []byte {
	t.Helper()
	return must[[]byte](t)(apppayload.Encode(apppayload.NewText(s)))
}

// EVENT-005, issue 19: a hosted client creates a group with a test peer in
// it and sends a text. The create is conversation.joined with origin
// created; the commit and the peer's Welcome (one, in the clear) and the
// text (sealed) are on fabric.out.<tenant>.<group>; the peer joins from the
// Welcome and reads the text; the own commit comes back through ingest and
// is accepted (the operation is done), the own text comes back as own_echo
// and is no message.received, and the peer's reply is.
func TestHostedClientCreatesGroupAndSends(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.worker("w1", nil)
	e.startIngest()
	h := e.register(sha256.Sum256([]byte("host")), 1)
	bob := peer(t, "bob")
	kp := must[[]byte](t)(bob.KeyPackage())

	name := components.Set{Profile: &components.ProfileState{Name: "team"}}
	comps := must[[]byte](t)(components.Encode(name))
	create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: h.rec.ClientID, Components: comps, KeyPackages: [][]byte{kp}})
	group := bus.OperationGroupID(create)
	ev := e.waitEvents(h.rec.ClientID, 1)
	j := ev[0].Event.ConversationJoined
	if j == nil || j.Origin != schema.OriginCreated || j.AdderInboxID != nil || !j.GroupID.Equal(group) {
		t.Fatalf("first event %s, want conversation.joined origin created", describe(ev[0].Event))
	}
	out := e.outboundMsgs(group, 2)
	if out[0].class != string(schema.ClassCommit) || out[0].transport.Kind != schema.TransportSealed ||
		out[1].class != string(schema.ClassWelcome) || out[1].transport.Kind != schema.TransportMLS ||
		out[0].opID != hex.EncodeToString(create) {
		t.Fatalf("outbound %+v", out)
	}
	bg, err := bob.Join(out[1].transport)
	if err != nil {
		t.Fatalf("bob joins from the hosted client's Welcome: %v", err)
	}
	rec := e.operation(create, schema.OperationDone)
	if rec.Kind != schema.OpCreateConversation || len(rec.MessageIDs) != 2 || hex.EncodeToString(rec.MessageIDs[0]) != out[0].id {
		t.Fatalf("create record %+v", rec)
	}
	if o := e.settledOutcome(must[[]byte](t)(hex.DecodeString(out[0].id))); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("own commit outcome %+v", o)
	}
	// The own commit was applied: the membership event names bob.
	ev = e.waitEvents(h.rec.ClientID, 2)
	if mc := ev[1].Event.MembershipChanged; mc == nil || !slices.Equal(mc.AddedInboxIDs, []string{bob.InboxID()}) {
		t.Fatalf("second event %s, want bob added", describe(ev[1].Event))
	}

	send := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: h.rec.ClientID, GroupID: group, Payload: textOf(t, "hello bob")})
	out = e.outboundMsgs(group, 3)
	if out[2].class != string(schema.ClassApplication) || out[2].transport.Kind != schema.TransportSealed {
		t.Fatalf("sent %+v", out[2])
	}
	r, err := bg.Process(out[2].transport)
	if err != nil || r.Kind != testpeer.KindApplication || r.SenderInboxID != h.rec.InboxID {
		t.Fatalf("bob reads the text: %+v %v", r, err)
	}
	if txt, _ := r.Payload.Text(); txt != "hello bob" {
		t.Fatalf("bob reads %q", txt)
	}
	rec = e.operation(send, schema.OperationDone)
	if len(rec.MessageIDs) != 1 || hex.EncodeToString(rec.MessageIDs[0]) != out[2].id {
		t.Fatalf("send record %+v", rec)
	}
	ev = e.waitEvents(h.rec.ClientID, 3)
	if sc := ev[2].Event.MessageStatusChanged; sc == nil || hex.EncodeToString(sc.MessageID) != out[2].id ||
		sc.Previous != schema.StatusUnpublished || sc.Current != schema.StatusPublished {
		t.Fatalf("third event %s, want message.status_changed published", describe(ev[2].Event))
	}
	if o := e.settledOutcome(must[[]byte](t)(hex.DecodeString(out[2].id))); o.Category != schema.CategoryOwnEcho {
		t.Fatalf("own message back: outcome %+v, want own_echo", o)
	}

	// Bob's reply reaches the hosted client, referencing its own message
	// (EVENT-021).
	reply := must[testpeer.Message](t)(bg.SendReply(must[[]byte](t)(hex.DecodeString(out[2].id)), "hi host"))
	e.publish(reply)
	ev = e.waitEvents(h.rec.ClientID, 4)
	if mr := ev[3].Event.MessageReceived; mr == nil || !mr.MessageID.Equal(reply.ID) || !ev[3].ReferencesOwn {
		t.Fatalf("fourth event %s (references own %v), want bob's reply to an own message", describe(ev[3].Event), ev[3].ReferencesOwn)
	}
}

// Issue 19, every commit operation through converge, with two hosted
// clients and a test peer: the admin adds the second hosted client by its
// KeyPackage (it joins from the Welcome that comes back through ingest)
// and renames the group; the second client's text reaches the admin and
// the peer; its add is refused before sending (authorization_failed,
// nothing on the outbound subject); it leaves, the admin's self-update
// commits the leave request (conversation.removed cause left, EVENT-006),
// and the admin removes the peer. The peer follows every commit.
func TestHostedClientsCommitAndAreRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.worker("w1", nil)
	e.startIngest()
	admin := e.register(sha256.Sum256([]byte("admin")), 1)
	other := e.register(sha256.Sum256([]byte("other")), 1)
	bob := peer(t, "bob")

	create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: admin.rec.ClientID, KeyPackages: [][]byte{must[[]byte](t)(bob.KeyPackage())}})
	group := bus.OperationGroupID(create)
	out := e.outboundMsgs(group, 2)
	bg := must[*testpeer.Group](t)(bob.Join(out[1].transport))
	e.operation(create, schema.OperationDone)
	follow := func(from int, n int) []outboundMsg {
		t.Helper()
		msgs := e.outboundMsgs(group, n)
		for _, m := range msgs[from:] {
			if m.class == string(schema.ClassWelcome) || bg.Removed() {
				continue
			}
			if _, err := bg.Process(m.transport); err != nil {
				t.Fatalf("bob processes %s: %v", m.class, err)
			}
		}
		return msgs
	}

	add := e.operate(bus.OperationRequest{Kind: schema.OpAddMembers, ClientID: admin.rec.ClientID, GroupID: group, KeyPackages: other.kps})
	follow(2, 4)
	if rec := e.operation(add, schema.OperationDone); len(rec.MessageIDs) != 2 {
		t.Fatalf("add record %+v", rec)
	}
	if j := e.waitEvents(other.rec.ClientID, 1)[0].Event.ConversationJoined; j == nil || j.Origin != schema.OriginWelcomed || *j.AdderInboxID != admin.rec.InboxID {
		t.Fatal("the second hosted client did not join from the admin's Welcome")
	}
	name := "renamed"
	rename := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: admin.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &name}})
	follow(4, 5)
	e.operation(rename, schema.OperationDone)
	if set := must[components.Set](t)(bg.Components()); set.Profile == nil || set.Profile.Name != "renamed" {
		t.Fatalf("bob sees %+v", set.Profile)
	}

	send := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: other.rec.ClientID, GroupID: group, Payload: textOf(t, "from the other")})
	out = follow(5, 6)
	e.operation(send, schema.OperationDone)
	evs := e.waitEvents(admin.rec.ClientID, 5) // joined, bob added, other added, renamed, the text
	if mr := evs[4].Event.MessageReceived; mr == nil || hex.EncodeToString(mr.MessageID) != out[5].id || mr.SenderInboxID != other.rec.InboxID {
		t.Fatalf("admin's fifth event %s, want the other's text", describe(evs[4].Event))
	}

	refused := e.operate(bus.OperationRequest{Kind: schema.OpAddMembers, ClientID: other.rec.ClientID, GroupID: group, KeyPackages: [][]byte{must[[]byte](t)(peer(t, "dave").KeyPackage())}})
	if rec := e.operation(refused, schema.OperationFailed); rec.Category != schema.CategoryAuthorizationFailed || len(rec.MessageIDs) != 0 {
		t.Fatalf("non-admin add record %+v", rec)
	}

	leave := e.operate(bus.OperationRequest{Kind: schema.OpLeave, ClientID: other.rec.ClientID, GroupID: group})
	follow(6, 7)
	// The leave request is committed once converge holds it (its outcome
	// has a disposition): the admin's next commit takes it by reference.
	proposal := e.operation(leave, schema.OperationDone).MessageIDs[0]
	eventually.True(t, "the leave request reached converge", func() bool { return e.outcome(proposal).Disposition != "" })
	update := e.operate(bus.OperationRequest{Kind: schema.OpSelfUpdate, ClientID: admin.rec.ClientID, GroupID: group})
	follow(7, 8)
	e.operation(update, schema.OperationDone)
	var removed *schema.ConversationRemoved
	// joined, renamed, its text's status, removed, and the membership
	// change that removed its own inbox
	for _, d := range e.waitEvents(other.rec.ClientID, 5) {
		if d.Event.ConversationRemoved != nil {
			removed = d.Event.ConversationRemoved
		}
	}
	if removed == nil || removed.Cause != schema.RemovalLeft {
		t.Fatalf("the leaver's removal %+v, want cause left", removed)
	}

	remove := e.operate(bus.OperationRequest{Kind: schema.OpRemoveMember, ClientID: admin.rec.ClientID, GroupID: group, InboxID: bob.InboxID()})
	follow(8, 9)
	e.operation(remove, schema.OperationDone)
	if !bg.Removed() {
		t.Fatal("bob was not removed")
	}
}

// Issue 19, Marmot convergence ("queue, then regenerate; never reuse a
// pre-selection staged commit"): two hosted admins of one group change it
// at once, one its name, the other its description: both own commits leave
// from the same epoch. Branch selection accepts one; the other operation
// is retried on the winner's state, its new commit accepted, and both
// operations are done. Nothing is lost: the final components hold both
// changes on both admins' conversations, and a send after it reaches the
// other admin.
func TestRacingOwnCommitsOneWinsTheOtherIsRetried(t *testing.T) {
	t.Parallel()
	e, a, b, group := twoAdmins(t)
	name, description := "by a", "by b"
	// Both are stored before either commit comes back: each is made from
	// the same epoch.
	opA := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: a.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &name}})
	opB := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: b.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Description: &description}})
	ra, rb := e.finalOperation(opA), e.finalOperation(opB)
	if ra.Status != schema.OperationDone || rb.Status != schema.OperationDone {
		t.Fatalf("records %+v and %+v: want both done", ra, rb)
	}
	// The loser's record names both its commits, the lost one first; the
	// last one of each operation is accepted.
	winner, loser := ra, rb
	if len(ra.MessageIDs) > len(rb.MessageIDs) {
		winner, loser = rb, ra
	}
	if len(winner.MessageIDs) != 1 || len(loser.MessageIDs) != 2 {
		t.Fatalf("records %+v and %+v: want one commit and two", winner, loser)
	}
	if o := e.outcome(loser.MessageIDs[0]); o.Disposition != schema.DispositionDeferred {
		t.Fatalf("the lost commit's outcome %+v", o)
	}
	for _, id := range [][]byte{winner.MessageIDs[0], loser.MessageIDs[1]} {
		if o := e.settledOutcome(id); o.Disposition != schema.DispositionAccepted {
			t.Fatalf("commit %x outcome %+v, want accepted", id[:4], o)
		}
	}
	for _, h := range []hosted{a, b} {
		set := e.conversationComponents(group, h.rec.ClientID)
		if set.Profile == nil || set.Profile.Name != name || set.Profile.Description != description {
			t.Fatalf("%s's conversation holds %+v, want both changes", h.rec.ClientID, set.Profile)
		}
	}
	// Both admins are on the same state: a text from b reaches a.
	send := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: b.rec.ClientID, GroupID: group, Payload: textOf(t, "after the race")})
	e.operation(send, schema.OperationDone)
	eventually.NoError(t, func() error {
		evs := e.events(a.rec.ClientID)
		if n := len(evs); n == 0 || evs[n-1].Event.MessageReceived == nil {
			return fmt.Errorf("a's events %v: b's text has not arrived", kinds(evs))
		}
		return nil
	})
}

// twoAdmins makes a group of two hosted admins through operations, lo
// the one of the lower inbox id: it wins a race of two privileged commits
// from one epoch (Marmot branch selection: lower committer). The create
// adds the members of kps too (a Welcome each, after hi's).
func twoAdmins(t *testing.T, kps ...[]byte) (e *env, lo, hi hosted, group []byte) {
	e = newEnv(t)
	e.worker("w1", nil)
	e.startIngest()
	lo = e.register(sha256.Sum256([]byte("admin-a")), 1)
	hi = e.register(sha256.Sum256([]byte("admin-b")), 1)
	if lo.rec.InboxID > hi.rec.InboxID {
		lo, hi = hi, lo
	}
	create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: lo.rec.ClientID, KeyPackages: append(slices.Clip(hi.kps), kps...)})
	group = bus.OperationGroupID(create)
	e.operation(create, schema.OperationDone)
	e.waitEvents(hi.rec.ClientID, 1) // joined
	admins := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: lo.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Admins: []string{lo.rec.InboxID, hi.rec.InboxID}}})
	e.operation(admins, schema.OperationDone)
	return e, lo, hi, group
}

// Issue 19, Marmot convergence (authorization is judged on the parent
// state): the admin of the lower inbox takes the other's admin rights
// while the other renames the group, both from one epoch. The admin change
// wins; the rename is made again on the winner's state, where its client
// is no admin: the operation is failed with authorization_failed, and
// nothing more is sent for it.
func TestRacingOwnCommitLosesAdminRightsIsRefused(t *testing.T) {
	t.Parallel()
	e, lo, hi, group := twoAdmins(t)
	name := "by the former admin"
	opLo := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: lo.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Admins: []string{lo.rec.InboxID}}})
	opHi := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: hi.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &name}})
	if rec := e.finalOperation(opLo); rec.Status != schema.OperationDone || len(rec.MessageIDs) != 1 {
		t.Fatalf("the admin change %+v, want done with one commit", rec)
	}
	rec := e.finalOperation(opHi)
	if rec.Status != schema.OperationFailed || rec.Category != schema.CategoryAuthorizationFailed || len(rec.MessageIDs) != 1 {
		t.Fatalf("the rename %+v, want failed authorization_failed with only its lost commit", rec)
	}
	set := e.conversationComponents(group, hi.rec.ClientID)
	if set.Profile != nil && set.Profile.Name == name || len(set.Admins) != 1 {
		t.Fatalf("components %+v", set)
	}
}

// Issue 19: both admins give the group the same name from one epoch. The
// loser's intent is held by the winner's state: its operation is done
// without another commit.
func TestRacingOwnCommitAlreadyHeldIsDone(t *testing.T) {
	t.Parallel()
	e, lo, hi, group := twoAdmins(t)
	name := "the same"
	opLo := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: lo.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &name}})
	opHi := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: hi.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &name}})
	for _, op := range [][]byte{opLo, opHi} {
		if rec := e.finalOperation(op); rec.Status != schema.OperationDone || len(rec.MessageIDs) != 1 {
			t.Fatalf("record %+v, want done with one commit", rec)
		}
	}
	if o := e.outcome(e.lastOperation(opHi).MessageIDs[0]); o.Disposition != schema.DispositionDeferred {
		t.Fatalf("the higher inbox's commit won: %+v", o)
	}
	// Nothing else was sent: the add and its Welcome, the admins, the two
	// renames.
	out := e.outboundMsgs(group, 5)
	if out[3].opID != hex.EncodeToString(opLo) || out[4].opID != hex.EncodeToString(opHi) {
		t.Fatalf("outbound %+v", out)
	}
}

// Issue 19: one admin changes the group three times at once: its three
// commits leave from one epoch and race each other. One wins; the other
// two are made again one at a time (a client has one commit in flight), so
// they do not race again: all three are done, and the final components
// hold the three changes.
func TestOwnCommitsOfOneClientAreRetriedOneAtATime(t *testing.T) {
	t.Parallel()
	e, lo, _, group := twoAdmins(t)
	name, description, image := "name", "description", "https://example.com/a.png"
	patches := []bus.ComponentsPatch{{Name: &name}, {Description: &description}, {ImageURL: &image}}
	var ops [][]byte
	for _, p := range patches {
		ops = append(ops, e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: lo.rec.ClientID, GroupID: group, Patch: &p}))
	}
	commits := 0
	for _, op := range ops {
		rec := e.finalOperation(op)
		if rec.Status != schema.OperationDone {
			t.Fatalf("record %+v, want done", rec)
		}
		commits += len(rec.MessageIDs)
	}
	if commits > 5 {
		t.Fatalf("%d commits for three changes, want at most 5 (one winner, two retried once)", commits)
	}
	set := e.conversationComponents(group, lo.rec.ClientID)
	if set.Profile == nil || set.Profile.Name != name || set.Profile.Description != description || set.Avatar == nil || set.Avatar.URL != image {
		t.Fatalf("components %+v %+v, want the three changes", set.Profile, set.Avatar)
	}
}

// Issue 19, one commit of a client at a time: one admin's three changes
// leave from one epoch; the commit of the highest digest comes back
// first and wins, the first of the other two is made again on it, and
// the last waits. The waiting one's commit then comes back alone and
// wins over the first (lower digest, same depth), but the retried commit
// already sent extends the first and wins back when it arrives. The
// waiting operation must not be done by that passing win: every
// operation done holds its change in the final components. The
// outbound consumer is paused so the commits come back in this order.
func TestOwnCommitWinningBehindItsClientsRetryIsNotDoneByIt(t *testing.T) {
	t.Parallel()
	e, lo, _, group := twoAdmins(t)
	submit := e.startIngest()
	if _, err := e.js.PauseConsumer(e.ctx, streams.StreamEvents, streams.ConsumerOutbound, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	before := len(e.outboundMsgs(group, 3)) // the add, its Welcome, the admins
	name, description, image := "name", "description", "https://example.com/a.png"
	patches := []bus.ComponentsPatch{{Name: &name}, {Description: &description}, {ImageURL: &image}}
	var ops [][]byte
	for _, p := range patches {
		ops = append(ops, e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: lo.rec.ClientID, GroupID: group, Patch: &p}))
	}
	out := e.outboundMsgs(group, before+3)[before:]
	first := 0 // the highest digest wins over neither other commit
	for i := range out {
		if out[i].id > out[first].id {
			first = i
		}
	}
	back := func(m outboundMsg) []byte {
		r := submit(m.transport)
		if r.Status != schema.StatusQueued {
			t.Fatalf("commit %s submitted: %+v", m.id, r)
		}
		return r.MessageID
	}
	back(out[first])
	e.operation(ops[first], schema.OperationDone)
	out = e.outboundMsgs(group, before+4)
	waiting := 2
	if first == 2 {
		waiting = 1
	}
	e.settledOutcome(back(out[before+waiting]))
	if rec := e.lastOperation(ops[waiting]); rec.Status == schema.OperationDone {
		t.Fatalf("record %+v done by a win its client's retried commit takes back", rec)
	}
	if _, err := e.js.ResumeConsumer(e.ctx, streams.StreamEvents, streams.ConsumerOutbound); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if rec := e.finalOperation(op); rec.Status != schema.OperationDone {
			t.Fatalf("record %+v, want done", rec)
		}
	}
	set := e.conversationComponents(group, lo.rec.ClientID)
	if set.Profile == nil || set.Profile.Name != name || set.Profile.Description != description || set.Avatar == nil || set.Avatar.URL != image {
		t.Fatalf("components %+v %+v, want the three changes", set.Profile, set.Avatar)
	}
}

// finalOperation waits for an operation's record to be done or failed.
func (e *env) finalOperation(id []byte) schema.Operation {
	e.t.Helper()
	var rec schema.Operation
	eventually.NoErrorWithin(e.t, 30*time.Second, func() error {
		if rec = e.lastOperation(id); rec.Status != schema.OperationDone && rec.Status != schema.OperationFailed {
			return fmt.Errorf("operation %+v has not finished", rec)
		}
		return nil
	})
	return rec
}

// conversationRecord reads a client's readable conversation record.
func (e *env) conversationRecord(group []byte, clientID string) readmodel.Conversation {
	e.t.Helper()
	subj, err := readmodel.ConversationSubject(tenant, hex.EncodeToString(group), clientID)
	if err != nil {
		e.t.Fatal(err)
	}
	rec, err := readmodel.Last(e.ctx, e.js, subj)
	if err != nil {
		e.t.Fatal(err)
	}
	var c readmodel.Conversation
	if err := schema.UnmarshalMsgpack(rec.Data, &c); err != nil {
		e.t.Fatal(err)
	}
	return c
}

// conversationComponents reads the components of a client's readable
// conversation record.
func (e *env) conversationComponents(group []byte, clientID string) components.Set {
	e.t.Helper()
	set, err := components.Decode(e.conversationRecord(group, clientID).Components)
	if err != nil {
		e.t.Fatal(err)
	}
	return set
}

// createdWithPeer: a hosted client creates a group with a test peer in
// it, who joins from the client's Welcome. It returns the client, the
// group and the peer's view of it.
func (e *env) createdWithPeer() (hosted, []byte, *testpeer.Group) {
	e.t.Helper()
	h := e.register(sha256.Sum256([]byte("host")), 1)
	bob := peer(e.t, "bob")
	create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: h.rec.ClientID, KeyPackages: [][]byte{must[[]byte](e.t)(bob.KeyPackage())}})
	group := bus.OperationGroupID(create)
	e.operation(create, schema.OperationDone)
	out := e.outboundMsgs(group, 2)
	return h, group, must[*testpeer.Group](e.t)(bob.Join(out[1].transport))
}

// lastOperation reads an operation's current record, or the zero record.
func (e *env) lastOperation(id []byte) schema.Operation {
	e.t.Helper()
	subj, err := subject.Operation(tenant, hex.EncodeToString(id))
	if err != nil {
		e.t.Fatal(err)
	}
	s, err := e.js.Stream(e.ctx, streams.StreamEvents)
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(e.ctx, subj)
	if err != nil {
		return schema.Operation{}
	}
	rec, err := bus.DecodeOperationRecord(m.Data)
	if err != nil {
		e.t.Fatal(err)
	}
	return rec
}

// Issue 19, exactly once: after a worker stops and every partition
// consumer is deleted (as if no input was acknowledged), a new worker
// takes the group's input from the start; the operations already done
// are not executed again. Each send is on the outbound subject once, and
// the peer decrypts every one, the later ones included (no ratchet key is
// used twice), with the member state written every transaction and every
// fourth.
func TestOperationsSentOnceAcrossRedelivery(t *testing.T) {
	t.Parallel()
	for _, every := range []int{1, 4} {
		t.Run(fmt.Sprintf("snapshot-every-%d", every), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			snap := func(c *Config) { c.SnapshotEvery = every }
			_, stop := e.worker("w1", snap)
			e.startIngest()
			h, group, bg := e.createdWithPeer()
			send := func(text string) {
				t.Helper()
				e.operation(e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: h.rec.ClientID, GroupID: group, Payload: textOf(t, text)}), schema.OperationDone)
			}
			for i := range 3 {
				send(fmt.Sprintf("before %d", i))
			}
			stop()

			rewind(t, e)
			e.worker("w2", snap)
			for i := range 2 {
				send(fmt.Sprintf("after %d", i))
			}
			out := e.outboundMsgs(group, 7)
			seen := map[string]bool{}
			var texts []string
			for _, m := range out[2:] {
				if seen[m.opID] || seen[m.id] {
					t.Fatalf("operation %s or message %s on the outbound subject twice", m.opID, m.id)
				}
				seen[m.opID], seen[m.id] = true, true
				r, err := bg.Process(m.transport)
				if err != nil {
					t.Fatalf("bob decrypts %s: %v", m.id, err)
				}
				txt, _ := r.Payload.Text()
				texts = append(texts, txt)
			}
			if !slices.Equal(texts, []string{"before 0", "before 1", "before 2", "after 0", "after 1"}) {
				t.Fatalf("bob reads %q", texts)
			}
		})
	}
}

// Issue 19, SEND via EVENT (message.status_changed): a send that fails
// tells its client so from the fabric's own state, unpublished → failed.
// Refused before encryption, it made no MLS message: the event names the
// operation id as the message id (the id the app holds from the API's
// answer), and the operation record says why (unknown_group), naming no
// message and sending nothing.
func TestFailedSendIsStatusFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.worker("w1", nil)
	h := e.register(sha256.Sum256([]byte("host")), 1)
	outsider := e.register(sha256.Sum256([]byte("outsider")), 1)
	create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: h.rec.ClientID})
	group := bus.OperationGroupID(create)
	e.operation(create, schema.OperationDone)

	send := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: outsider.rec.ClientID, GroupID: group, Payload: textOf(t, "not a member")})
	rec := e.operation(send, schema.OperationFailed)
	if rec.Category != schema.CategoryUnknownGroup || len(rec.MessageIDs) != 0 {
		t.Fatalf("failed send record %+v", rec)
	}
	ev := e.waitEvents(outsider.rec.ClientID, 1)
	sc := ev[0].Event.MessageStatusChanged
	if sc == nil || !sc.GroupID.Equal(group) || !sc.MessageID.Equal(send) ||
		sc.Previous != schema.StatusUnpublished || sc.Current != schema.StatusFailed {
		t.Fatalf("event %s, want message.status_changed unpublished → failed naming the operation", describe(ev[0].Event))
	}
	e.outboundMsgs(group, 0)
	// A refused operation of another kind is no message: no event.
	leave := e.operate(bus.OperationRequest{Kind: schema.OpLeave, ClientID: outsider.rec.ClientID, GroupID: group})
	e.operation(leave, schema.OperationFailed)
	if evs := e.events(outsider.rec.ClientID); len(evs) != 1 {
		t.Fatalf("outsider's events %v, want only the send's status", kinds(evs))
	}
}

// Issue 26 (the hosted chaos test): a client's commit operations race each
// other, but never the client's retried commit. A rename made while the
// client's lost rename is retried waits and is made on the state the retry
// leaves; before, each later rename of the client could win over the retry
// and the rename failed stale_epoch after three attempts while nothing but
// its own client committed.
func TestCommitOperationWaitsBehindItsClientsRetry(t *testing.T) {
	t.Parallel()
	e, lo, hi, group := twoAdmins(t)
	submit := e.startIngest()
	if _, err := e.js.PauseConsumer(e.ctx, streams.StreamEvents, streams.ConsumerOutbound, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	back := func(m outboundMsg) {
		if r := submit(m.transport); r.Status != schema.StatusQueued {
			t.Fatalf("commit %s submitted: %+v", m.id, r)
		}
	}
	rename := func(name string) []byte {
		return e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: lo.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &name}})
	}
	before := len(e.outboundMsgs(group, 3)) // the add, its Welcome, the admins
	opA, opB := rename("a"), rename("b")
	out := e.outboundMsgs(group, before+2)
	back(out[before+1]) // b wins, alone: a lost and is retried on b's state
	e.operation(opB, schema.OperationDone)
	retry := e.outboundMsgs(group, before+3)[before+2]
	if retry.class != string(schema.ClassCommit) || retry.opID != hex.EncodeToString(opA) {
		t.Fatalf("after b won, outbound %+v, want a's retried commit", retry)
	}

	opC := rename("c")
	// The group's inputs are taken in order: once hi's send is done, c was
	// taken, and waits.
	send := e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: hi.rec.ClientID, GroupID: group, Payload: textOf(t, "after c")})
	e.operation(send, schema.OperationDone)
	if m := e.outboundMsgs(group, before+4)[before+3]; m.opID != hex.EncodeToString(send) {
		t.Fatalf("outbound %+v while a's retry is on its way, want hi's send only", m)
	}
	back(retry)
	e.operation(opA, schema.OperationDone)
	if m := e.outboundMsgs(group, before+5)[before+4]; m.class != string(schema.ClassCommit) || m.opID != hex.EncodeToString(opC) {
		t.Fatalf("outbound %+v after a's retry settled, want c's commit", m)
	}
	if _, err := e.js.ResumeConsumer(e.ctx, streams.StreamEvents, streams.ConsumerOutbound); err != nil {
		t.Fatal(err)
	}
	if rec := e.finalOperation(opC); rec.Status != schema.OperationDone || len(rec.MessageIDs) != 1 {
		t.Fatalf("c %+v, want done with one commit", rec)
	}
	if set := e.conversationComponents(group, lo.rec.ClientID); set.Profile == nil || set.Profile.Name != "c" {
		t.Fatalf("profile %+v, want the last rename", set.Profile)
	}
}
