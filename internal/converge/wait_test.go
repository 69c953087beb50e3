package converge

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// hostWithPeer makes a group of a hosted client and a test peer, bob,
// through a create operation, with converge worker w1 (cfg) and ingest
// running; bob joined from the Welcome and the create is done. It returns
// the worker's stop function too.
func hostWithPeer(t *testing.T, e *env, cfg func(*Config)) (h hosted, bg *testpeer.Group, group []byte, stop func()) {
	t.Helper()
	_, stop = e.worker("w1", cfg)
	e.startIngest()
	h = e.register(sha256.Sum256([]byte("host")), 1)
	bob := peer(t, "bob")
	create := e.operate(bus.OperationRequest{Kind: schema.OpCreateConversation, ClientID: h.rec.ClientID, KeyPackages: [][]byte{must[[]byte](t)(bob.KeyPackage())}})
	group = bus.OperationGroupID(create)
	e.operation(create, schema.OperationDone)
	bg = must[*testpeer.Group](t)(bob.Join(e.outboundMsgs(group, 2)[1].transport))
	return h, bg, group, stop
}

// sendTexts stores one send operation of each text for a client, back to
// back, and returns their ids.
func (e *env) sendTexts(clientID string, group []byte, texts []string) [][]byte {
	e.t.Helper()
	var ops [][]byte
	for _, text := range texts {
		ops = append(ops, e.operate(bus.OperationRequest{Kind: schema.OpSendMessage, ClientID: clientID, GroupID: group, Payload: textOf(e.t, text)}))
	}
	return ops
}

// peerFollows has the peer process the group's outbound messages from
// index from, in order: each commit whose id is not in lost (a commit of
// the fabric that lost a race), every application message. It fails unless
// every one is processed, and unless the application messages are the
// sends, in order, each once, each reading its text and each the message
// its operation's record names. It returns the outbound messages.
func (e *env) peerFollows(bg *testpeer.Group, group []byte, from, n int, lost [][]byte, sends [][]byte, texts []string) []outboundMsg {
	e.t.Helper()
	out := e.outboundMsgs(group, n)
	var apps []outboundMsg
	for _, m := range out[from:] {
		id := must[[]byte](e.t)(hex.DecodeString(m.id))
		switch {
		case m.class == string(schema.ClassWelcome):
			continue
		case m.class == string(schema.ClassCommit) && slices.ContainsFunc(lost, func(l []byte) bool { return bytes.Equal(l, id) }):
			continue
		}
		r, err := bg.Process(m.transport)
		if err != nil {
			e.t.Fatalf("bob processes the %s %s at epoch %d: %v", m.class, m.id[:8], bg.Epoch(), err)
		}
		if m.class == string(schema.ClassApplication) {
			if txt, _ := r.Payload.Text(); txt != texts[len(apps)] {
				e.t.Fatalf("bob reads %q as text %d, want %q", txt, len(apps), texts[len(apps)])
			}
			apps = append(apps, m)
		}
	}
	if len(apps) != len(sends) {
		e.t.Fatalf("%d application messages for %d sends", len(apps), len(sends))
	}
	for i, m := range apps {
		rec := e.operation(sends[i], schema.OperationDone)
		if m.opID != hex.EncodeToString(sends[i]) || len(rec.MessageIDs) != 1 || hex.EncodeToString(rec.MessageIDs[0]) != m.id {
			e.t.Fatalf("send %d: message %s of operation %s, record %+v", i, m.id, m.opID, rec)
		}
	}
	return out
}

// statusChanges waits for a client's n message.status_changed events and
// returns the message ids they name, in order, failing unless each is
// unpublished → published.
func (e *env) statusChanges(clientID string, n int) []string {
	e.t.Helper()
	var ids []string
	eventually.NoError(e.t, func() error {
		ids = ids[:0]
		for _, d := range e.events(clientID) {
			if sc := d.Event.MessageStatusChanged; sc != nil {
				if sc.Previous != schema.StatusUnpublished || sc.Current != schema.StatusPublished {
					e.t.Fatalf("status %s → %s", sc.Previous, sc.Current)
				}
				ids = append(ids, hex.EncodeToString(sc.MessageID))
			}
		}
		if len(ids) < n {
			return fmt.Errorf("%d message.status_changed events, want %d", len(ids), n)
		}
		return nil
	})
	if len(ids) != n {
		e.t.Fatalf("%d message.status_changed events, want %d", len(ids), n)
	}
	return ids
}

// readableIDs reads the ids of a group's first n readable message records
// (the read API's messages, by delivery number), failing unless each is
// delivered.
func (e *env) readableIDs(group []byte, n int) []string {
	e.t.Helper()
	s, err := e.js.Stream(e.ctx, streams.StreamEvents)
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []string
	for i := range n {
		subj := must[string](e.t)(readmodel.MessageSubject(tenant, hex.EncodeToString(group), uint64(i+1)))
		raw, err := s.GetLastMsgForSubject(e.ctx, subj)
		if err != nil {
			e.t.Fatalf("readable message %d: %v", i+1, err)
		}
		var rec readmodel.Message
		if err := schema.UnmarshalMsgpack(raw.Data, &rec); err != nil || rec.State != readmodel.StateDelivered {
			e.t.Fatalf("readable message %d: %+v %v", i+1, rec, err)
		}
		ids = append(ids, hex.EncodeToString(rec.ID))
	}
	return ids
}

// appIDs are the ids of the application messages among out.
func appIDs(out []outboundMsg) []string {
	var ids []string
	for _, m := range out {
		if m.class == string(schema.ClassApplication) {
			ids = append(ids, m.id)
		}
	}
	return ids
}

// Issue 19, Marmot group-state ("while not Settled, do not prepare commits
// or encrypt: queue"): a hosted client renames the group, or updates its
// own leaf, and sends texts right behind the commit, before it comes back.
// The sends wait for the commit in the group's state and are encrypted in
// the epoch it makes, once it is accepted: an mls-go peer that applied the
// commit decrypts every text, in order, each once (a text of the commit's
// parent epoch behind the commit fails its signature there). The client's
// message.status_changed events and the read API's messages name them in
// that order.
func TestSendsBehindAnOwnCommitWaitForIt(t *testing.T) {
	t.Parallel()
	name := "renamed"
	for _, req := range []bus.OperationRequest{
		{Kind: schema.OpUpdateConversation, Patch: &bus.ComponentsPatch{Name: &name}},
		{Kind: schema.OpSelfUpdate},
	} {
		t.Run(string(req.Kind), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			h, bg, group, _ := hostWithPeer(t, e, nil)
			req.ClientID, req.GroupID = h.rec.ClientID, group
			commit := e.operate(req)
			texts := []string{"one", "two", "three"}
			sends := e.sendTexts(h.rec.ClientID, group, texts)
			out := e.peerFollows(bg, group, 2, 6, nil, sends, texts)
			if out[2].class != string(schema.ClassCommit) || out[2].opID != hex.EncodeToString(commit) {
				t.Fatalf("outbound %+v: want the commit before the texts", out[2])
			}
			e.operation(commit, schema.OperationDone)
			if got, want := e.statusChanges(h.rec.ClientID, 3), appIDs(out); !slices.Equal(got, want) {
				t.Fatalf("message.status_changed names %v, want %v", got, want)
			}
			if got, want := e.readableIDs(group, 3), appIDs(out); !slices.Equal(got, want) {
				t.Fatalf("readable messages %v, want %v", got, want)
			}
		})
	}
}

// Issue 19: the own commit the sends wait for loses a race (both admins
// rename from one epoch; the lower inbox wins) and is retried on the
// winner's state: the sends wait for the retried commit, and the peer,
// following the accepted commits, decrypts every text in the epoch that
// commit made, in order, each once.
func TestSendsWaitForARetriedOwnCommit(t *testing.T) {
	t.Parallel()
	bob := peer(t, "bob")
	e, lo, hi, group := twoAdmins(t, must[[]byte](t)(bob.KeyPackage()))
	bg := must[*testpeer.Group](t)(bob.Join(e.outboundMsgs(group, 4)[2].transport))

	nameLo, nameHi := "by lo", "by hi"
	opLo := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: lo.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &nameLo}})
	opHi := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: hi.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &nameHi}})
	texts := []string{"one", "two", "three"}
	sends := e.sendTexts(hi.rec.ClientID, group, texts)
	if rec := e.finalOperation(opLo); rec.Status != schema.OperationDone || len(rec.MessageIDs) != 1 {
		t.Fatalf("the winner %+v, want done with one commit", rec)
	}
	rec := e.finalOperation(opHi)
	if rec.Status != schema.OperationDone || len(rec.MessageIDs) != 2 {
		t.Fatalf("the loser %+v, want done with a lost commit and a retried one", rec)
	}
	// create: commit, two Welcomes; the admins; lo's, hi's lost and hi's
	// retried commits; the three texts.
	out := e.peerFollows(bg, group, 3, 10, [][]byte{rec.MessageIDs[0]}, sends, texts)
	if hex.EncodeToString(rec.MessageIDs[1]) != out[6].id {
		t.Fatalf("outbound %+v: want the retried commit before the texts", out[6])
	}
	if set := must[components.Set](t)(bg.Components()); set.Profile == nil || set.Profile.Name != nameHi {
		t.Fatalf("bob's components %+v, want hi's name last", set.Profile)
	}
	if got, want := e.statusChanges(hi.rec.ClientID, 3), appIDs(out); !slices.Equal(got, want) {
		t.Fatalf("message.status_changed names %v, want %v", got, want)
	}
}

// Issue 19, exactly once: sends that wait for an own commit are part of
// the stored group state. The worker stops while they wait (the commit's
// pass is held frozen), every partition consumer is deleted, and a new
// worker takes the group's input from the start: the sends are not
// executed again as input, and once the commit is accepted each is sent
// once, in order, in the epoch the commit made, with the member state
// written every transaction and every fourth.
func TestWaitingSendsSentOnceAcrossRedelivery(t *testing.T) {
	t.Parallel()
	for _, every := range []int{1, 4} {
		t.Run(fmt.Sprintf("snapshot-every-%d", every), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			var hold atomic.Bool
			e.hooks.holdFrozen = hold.Load
			snap := func(c *Config) { c.SnapshotEvery = every }
			h, bg, group, stop := hostWithPeer(t, e, snap)
			hold.Store(true)
			name := "renamed"
			rename := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: h.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &name}})
			texts := []string{"one", "two", "three"}
			sends := e.sendTexts(h.rec.ClientID, group, texts)
			eventually.NoError(t, func() error {
				if n := e.storedWaiting(group); n != len(sends) {
					return fmt.Errorf("stored group state waits for %d sends, want %d", n, len(sends))
				}
				return nil
			})
			// Converge writes no record of a waiting send: the API's
			// queued stays its last (this test stores no API record).
			for _, op := range sends {
				if rec := e.lastOperation(op); rec.Status != "" {
					t.Fatalf("a waiting send's record %+v, want none", rec)
				}
			}
			stop()
			rewind(t, e)
			hold.Store(false)
			e.worker("w2", snap)
			e.operation(rename, schema.OperationDone)
			e.peerFollows(bg, group, 2, 6, nil, sends, texts)
		})
	}
}

// Issue 19: what waits for own commits is bounded: a send past the bound
// fails with resource_refused (its client told unpublished → failed,
// naming the operation, nothing sent), and the sends that waited are sent
// once the commit is accepted.
func TestSendPastTheWaitingBoundIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.hooks.maxWaiting = 2
	var hold atomic.Bool
	e.hooks.holdFrozen = hold.Load
	h, bg, group, _ := hostWithPeer(t, e, nil)
	hold.Store(true)
	name := "renamed"
	rename := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: h.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &name}})
	sends := e.sendTexts(h.rec.ClientID, group, []string{"one", "two", "three"})
	rec := e.operation(sends[2], schema.OperationFailed)
	if rec.Category != schema.CategoryResourceRefused || len(rec.MessageIDs) != 0 {
		t.Fatalf("the send past the bound %+v, want failed resource_refused", rec)
	}
	var failed bool
	for _, d := range e.events(h.rec.ClientID) {
		if sc := d.Event.MessageStatusChanged; sc != nil && sc.MessageID.Equal(sends[2]) && sc.Current == schema.StatusFailed {
			failed = true
		}
	}
	if !failed {
		t.Fatalf("events %v: no message.status_changed failed naming the refused send", kinds(e.events(h.rec.ClientID)))
	}
	hold.Store(false)
	e.operation(rename, schema.OperationDone)
	e.peerFollows(bg, group, 2, 5, nil, sends[:2], []string{"one", "two"})
}

// storedWaiting reads how many operations wait in the group state the
// group's checkpoint names; -1 when that blob is gone (a newer checkpoint
// replaced it while it was read).
func (e *env) storedWaiting(group []byte) int {
	e.t.Helper()
	g := e.storedGroup(group)
	if g == nil {
		return -1
	}
	return len(g.Waiting)
}

// Issue 19: when the operation the sends wait for finally fails (the
// winner of the race took its client's admin rights: the rename made again
// is authorization_failed), the sends are made on the client's canonical
// state, the winner's epoch, in order: the other admin receives each.
func TestSendsBehindAFailedOwnCommitAreSent(t *testing.T) {
	t.Parallel()
	e, lo, hi, group := twoAdmins(t)
	name := "by the former admin"
	opLo := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: lo.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Admins: []string{lo.rec.InboxID}}})
	opHi := e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: hi.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Name: &name}})
	sends := e.sendTexts(hi.rec.ClientID, group, []string{"one", "two"})
	e.finalOperation(opLo)
	if rec := e.finalOperation(opHi); rec.Status != schema.OperationFailed || rec.Category != schema.CategoryAuthorizationFailed {
		t.Fatalf("the rename %+v, want failed authorization_failed", rec)
	}
	var want []string
	for _, op := range sends {
		want = append(want, hex.EncodeToString(e.operation(op, schema.OperationDone).MessageIDs[0]))
	}
	eventually.NoError(t, func() error {
		var got []string
		for _, d := range e.events(lo.rec.ClientID) {
			if mr := d.Event.MessageReceived; mr != nil {
				got = append(got, hex.EncodeToString(mr.MessageID))
			}
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("the other admin received %v, want %v", got, want)
		}
		return nil
	})
}

// Issue 19, GMOD-031: a leave request behind the client's pending
// self-update waits for it too, and is made in the epoch the update made:
// the admin's next commit takes it by reference and the client is removed
// with cause left (EVENT-006). A request of the update's parent epoch
// could not be committed there.
func TestLeaveBehindAnOwnCommitWaitsForIt(t *testing.T) {
	t.Parallel()
	e, lo, hi, group := twoAdmins(t)
	e.operation(e.operate(bus.OperationRequest{Kind: schema.OpUpdateConversation, ClientID: lo.rec.ClientID, GroupID: group, Patch: &bus.ComponentsPatch{Admins: []string{lo.rec.InboxID}}}), schema.OperationDone)
	update := e.operate(bus.OperationRequest{Kind: schema.OpSelfUpdate, ClientID: hi.rec.ClientID, GroupID: group})
	leave := e.operate(bus.OperationRequest{Kind: schema.OpLeave, ClientID: hi.rec.ClientID, GroupID: group})
	e.operation(update, schema.OperationDone)
	proposal := e.operation(leave, schema.OperationDone).MessageIDs[0]
	eventually.True(t, "the leave request reached converge", func() bool { return e.outcome(proposal).Disposition != "" })
	e.operation(e.operate(bus.OperationRequest{Kind: schema.OpSelfUpdate, ClientID: lo.rec.ClientID, GroupID: group}), schema.OperationDone)
	eventually.NoError(t, func() error {
		var removed *schema.ConversationRemoved
		for _, d := range e.events(hi.rec.ClientID) {
			if d.Event.ConversationRemoved != nil {
				removed = d.Event.ConversationRemoved
			}
		}
		if removed == nil || removed.Cause != schema.RemovalLeft {
			return fmt.Errorf("the leaver's removal %+v, want cause left", removed)
		}
		return nil
	})
}
