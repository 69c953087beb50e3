package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Issue 19, both directions, through the HTTP API and the Go SDK on the
// all-in-one: hosted client one creates a group with a real MLS peer and
// hosted client two in it; the peer writes to the hosted clients, client
// one to the peer and to client two, client two replies to client one;
// client one renames the group (client two may not: not an admin), removes
// the peer, and commits client two's leave request; then it writes alone.
// Each hosted client's events are read in order through the SDK and each
// is checked against the client events spec: the kinds (EVENT-001, EVENT-012
// order), join origin and adder (EVENT-005, EVENT-023), removal cause
// (EVENT-006), changed names (EVENT-019), message group and sender
// (EVENT-018, EVENT-024), the filter on references to own messages
// (EVENT-020, EVENT-021), message.status_changed of sent messages (SEND);
// the own messages' outcomes (own_echo only where no other hosted member
// delivers them); and what the read API answers at each step (EVENT-010:
// the change is readable once its event is out). The peer reads every
// message the fabric sent from the outbound subject, as a bridge would.
func TestScenarioHostedClientsAndPeerBothDirections(t *testing.T) {
	t.Parallel()
	oneInProcess(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	app := startHostedApp(t, ctx)
	f, api, ops, reader, c, out := app.f, app.api, app.ops, app.reader, app.events, app.out
	register := func() (demo.Registered, *client.Subscription) { return app.register(t, ctx) }
	one, sub1 := register()
	two, sub2 := register()
	// EVENT-020, EVENT-021: only message.received of replies and
	// reactions to client one's own messages.
	own1 := ok[*client.Subscription](t)(c.Subscribe(ctx, one.ClientID, schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}, ReferencesOwnMessages: true}))
	peer := ok[*testpeer.Peer](t)(testpeer.New("peer"))

	// Create with the peer and client two.
	name := "scenario"
	created := ok[schema.OperationAccepted](t)(ops.CreateConversation(ctx, one.ClientID, "create", schema.CreateConversation{
		Name: &name, KeyPackages: []schema.Bytes{ok[[]byte](t)(peer.KeyPackage()), two.KeyPackages[0]}}))
	group := []byte(created.GroupID)
	j := next(t, sub1, schema.KindConversationJoined).ConversationJoined
	if !bytes.Equal(j.GroupID, group) || j.Origin != schema.OriginCreated || j.AdderInboxID != nil || j.ConversationType != schema.ConversationGroup {
		t.Fatalf("client one's conversation.joined %+v, want origin created, no adder (EVENT-005, EVENT-023)", j)
	}
	wantMembership(t, sub1, group, []string{peer.InboxID(), two.InboxID}, nil)
	j = next(t, sub2, schema.KindConversationJoined).ConversationJoined
	if !bytes.Equal(j.GroupID, group) || j.Origin != schema.OriginWelcomed || j.AdderInboxID == nil || *j.AdderInboxID != one.InboxID || j.ConversationType != schema.ConversationGroup {
		t.Fatalf("client two's conversation.joined %+v, want origin welcomed, adder client one (EVENT-005, EVENT-023)", j)
	}
	msgs := out.read(group, 3) // the commit, then one Welcome each
	var pg *testpeer.Group
	for _, m := range msgs[1:] {
		if g, err := peer.Join(m); err == nil {
			pg = g
		}
	}
	if msgs[0].Kind != schema.TransportSealed || pg == nil {
		t.Fatal("the peer found no Welcome of its own after the sealed commit")
	}
	if rec := operationDone(t, ctx, ops, one.ClientID, created.OperationID); len(rec.MessageIDs) != 3 {
		t.Fatalf("create record %+v, want the commit and two Welcomes", rec)
	}
	for _, h := range []demo.Registered{one, two} {
		conv := ok[schema.Conversation](t)(reader.Conversation(ctx, h.ClientID, group))
		role := schema.RoleMember
		if h.ClientID == one.ClientID {
			role = schema.RoleAdmin
		}
		if conv.Components.GroupName == nil || *conv.Components.GroupName != name || conv.Membership != schema.MembershipActive ||
			conv.Members.Inboxes != 3 || conv.Role != role || conv.ConversationType != schema.ConversationGroup {
			t.Fatalf("%s (inbox %s; one %s) reads %+v", h.ClientID, h.InboxID, one.ClientID, conv)
		}
		wantMembers(t, reader, h.ClientID, group, one.InboxID, two.InboxID, peer.InboxID())
	}

	// Peer → hosted.
	fromPeer := ok[testpeer.Message](t)(pg.SendText("from the peer"))
	if res := ok[[]demo.IntakeResult](t)(api.Post(ctx, fromPeer.Transport)); res[0].Status != string(schema.StatusQueued) {
		t.Fatalf("the peer's text at the intake: %+v", res)
	}
	for _, sub := range []*client.Subscription{sub1, sub2} {
		wantReceived(t, sub, group, fromPeer.ID, peer.InboxID(), "text")
	}
	if o := settled(t, ctx, f.URL, api.IngestToken, fromPeer.ID); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("the peer's text: outcome %+v", o)
	}

	// Hosted → peer and hosted → hosted.
	sent := ok[schema.OperationAccepted](t)(ops.SendText(ctx, one.ClientID, group, "text-1", "from client one"))
	fromOne := wantPublished(t, sub1, group)
	wantReceived(t, sub2, group, fromOne, one.InboxID, "text")
	if rec := operationDone(t, ctx, ops, one.ClientID, sent.OperationID); len(rec.MessageIDs) != 1 || !bytes.Equal(rec.MessageIDs[0], fromOne) {
		t.Fatalf("send record %+v", rec)
	}
	if r := out.peerReads(pg, group); r.Kind != testpeer.KindApplication || !bytes.Equal(r.ID, fromOne) || r.SenderInboxID != one.InboxID || text(t, r) != "from client one" {
		t.Fatalf("the peer reads %+v", r)
	}
	// Client two delivers it: accepted, not own_echo.
	if o := settled(t, ctx, f.URL, api.IngestToken, fromOne); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("client one's text with client two in the group: outcome %+v", o)
	}

	// Hosted ↔ hosted: client two replies to client one's text.
	replyText := "from client two"
	reply := ok[schema.OperationAccepted](t)(ops.Send(ctx, two.ClientID, group, "reply-1", schema.SendMessage{Text: &replyText, ReplyTo: fromOne}))
	fromTwo := wantPublished(t, sub2, group)
	wantReceived(t, sub1, group, fromTwo, two.InboxID, "reply")
	if mr := next(t, own1, schema.KindMessageReceived).MessageReceived; !bytes.Equal(mr.MessageID, fromTwo) {
		t.Fatalf("the references-own subscription handed off %+v, want client two's reply (EVENT-021)", mr)
	}
	operationDone(t, ctx, ops, two.ClientID, reply.OperationID)
	if o := settled(t, ctx, f.URL, api.IngestToken, fromTwo); o.Disposition != schema.DispositionAccepted {
		t.Fatalf("client two's reply, delivered by client one: outcome %+v", o)
	}
	if r := out.peerReads(pg, group); !bytes.Equal(r.ID, fromTwo) || r.SenderInboxID != two.InboxID {
		t.Fatalf("the peer reads %+v", r)
	}
	for _, h := range []demo.Registered{one, two} {
		wantMessages(t, reader, h.ClientID, group, []sentBy{{fromPeer.ID, peer.InboxID()}, {fromOne, one.InboxID}, {fromTwo, two.InboxID}})
	}

	// A rename by a non-admin is refused before sending; the admin's
	// renames the group on every side (EVENT-019: group_name).
	other := "not by a member"
	refused := ok[schema.OperationAccepted](t)(ops.UpdateConversation(ctx, two.ClientID, group, "rename-2", schema.ConversationChanges{Name: &other}))
	if rec := operationFinal(t, ctx, ops, two.ClientID, refused.OperationID); rec.Status != schema.OperationFailed || rec.Category != schema.CategoryAuthorizationFailed || len(rec.MessageIDs) != 0 {
		t.Fatalf("client two's rename %+v, want failed authorization_failed, nothing sent", rec)
	}
	renamed := "renamed"
	rename := ok[schema.OperationAccepted](t)(ops.UpdateConversation(ctx, one.ClientID, group, "rename-1", schema.ConversationChanges{Name: &renamed}))
	for _, sub := range []*client.Subscription{sub1, sub2} {
		if mc := next(t, sub, schema.KindMetadataChanged).MetadataChanged; !bytes.Equal(mc.GroupID, group) || !slices.Equal(mc.Changed, []string{"group_name"}) {
			t.Fatalf("metadata_changed %+v, want group_name (EVENT-019)", mc)
		}
	}
	operationDone(t, ctx, ops, one.ClientID, rename.OperationID)
	if r := out.peerReads(pg, group); r.Kind != testpeer.KindCommit {
		t.Fatalf("the peer reads %+v, want the rename", r)
	}
	if set := ok[components.Set](t)(pg.Components()); set.Profile == nil || set.Profile.Name != renamed {
		t.Fatalf("the peer holds %+v", set.Profile)
	}
	for _, h := range []demo.Registered{one, two} {
		// The epoch is the peer's: every side is on one state.
		if conv := ok[schema.Conversation](t)(reader.Conversation(ctx, h.ClientID, group)); conv.Components.GroupName == nil || *conv.Components.GroupName != renamed ||
			conv.Epoch != pg.Epoch() || conv.Messages != 3 {
			t.Fatalf("%s reads the name %v at epoch %d with %d messages, want %q at the peer's epoch %d with 3", h.ClientID, conv.Components.GroupName, conv.Epoch, conv.Messages, renamed, pg.Epoch())
		}
	}

	// The peer is removed.
	remove := ok[schema.OperationAccepted](t)(ops.RemoveMember(ctx, one.ClientID, group, "remove-peer", peer.InboxID()))
	wantMembership(t, sub1, group, nil, []string{peer.InboxID()})
	wantMembership(t, sub2, group, nil, []string{peer.InboxID()})
	operationDone(t, ctx, ops, one.ClientID, remove.OperationID)
	out.peerReads(pg, group)
	if !pg.Removed() {
		t.Fatal("the peer does not see its removal")
	}
	wantMembers(t, reader, one.ClientID, group, one.InboxID, two.InboxID)

	// Client two leaves: its leave request is committed by client one's
	// self-update (EVENT-006: cause left; the commit that removes the own
	// inbox is conversation.removed, then membership_changed, EVENT-012).
	leave := ok[schema.OperationAccepted](t)(ops.Leave(ctx, two.ClientID, group, "leave"))
	request := operationDone(t, ctx, ops, two.ClientID, leave.OperationID).MessageIDs[0]
	settled(t, ctx, f.URL, api.IngestToken, request)
	update := ok[schema.OperationAccepted](t)(ops.SelfUpdate(ctx, one.ClientID, group, "update"))
	if rm := next(t, sub2, schema.KindConversationRemoved).ConversationRemoved; !bytes.Equal(rm.GroupID, group) || rm.Cause != schema.RemovalLeft {
		t.Fatalf("client two's conversation.removed %+v, want cause left (EVENT-006)", rm)
	}
	wantMembership(t, sub2, group, nil, []string{two.InboxID})
	wantMembership(t, sub1, group, nil, []string{two.InboxID})
	operationDone(t, ctx, ops, one.ClientID, update.OperationID)
	if conv := ok[schema.Conversation](t)(reader.Conversation(ctx, two.ClientID, group)); conv.Membership != schema.MembershipRemoved {
		t.Fatalf("client two reads membership %q after leaving", conv.Membership)
	}
	wantMembers(t, reader, one.ClientID, group, one.InboxID)

	// Alone, client one's own text comes back as own_echo: no other
	// hosted member delivers it, and client one holds it at once.
	alone := ok[schema.OperationAccepted](t)(ops.SendText(ctx, one.ClientID, group, "text-2", "alone"))
	fromAlone := wantPublished(t, sub1, group)
	operationDone(t, ctx, ops, one.ClientID, alone.OperationID)
	if o := settled(t, ctx, f.URL, api.IngestToken, fromAlone); o.Status != schema.StatusRejected || o.Category != schema.CategoryOwnEcho {
		t.Fatalf("client one's text alone: outcome %+v, want rejected own_echo", o)
	}
	wantMessages(t, reader, one.ClientID, group, []sentBy{{fromPeer.ID, peer.InboxID()}, {fromOne, one.InboxID}, {fromTwo, two.InboxID}, {fromAlone, one.InboxID}})
	// Client two holds what it held when it left.
	wantMessages(t, reader, two.ClientID, group, []sentBy{{fromPeer.ID, peer.InboxID()}, {fromOne, one.InboxID}, {fromTwo, two.InboxID}})

	// Nothing else: no event beyond those above (EVENT-001).
	for _, sub := range []*client.Subscription{sub1, sub2, own1} {
		wctx, wcancel := context.WithTimeout(ctx, time.Second)
		ev, err := sub.Next(wctx)
		wcancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("an event more: %+v (%v)", ev, err)
		}
	}
}

// hostedApp is an all-in-one in this process with what an app uses on it
// (the operations API, the read API, one events connection, its admin and
// ingest tokens) and what a test peer's bridge reads (the outbound subject).
type hostedApp struct {
	f      *allinone.Fabric
	api    *demo.API
	ops    *client.Operations
	reader *client.Reader
	events *client.Client
	out    *outbound
}

func startHostedApp(t *testing.T, ctx context.Context) *hostedApp {
	t.Helper()
	data := t.TempDir()
	f := startInProcess(t, ctx, func(o *allinone.Options) { o.DataDir = data })
	token := func(s auth.Scope) string { return ok[string](t)(f.Token(time.Hour, s)) }
	events := ok[*client.Client](t)(client.Connect(ctx, "ws"+strings.TrimPrefix(f.URL, "http")+"/v1/events", token(auth.ScopeEvents)))
	t.Cleanup(func() { _ = events.Close() })
	return &hostedApp{
		f:      f,
		api:    &demo.API{BaseURL: f.URL, Tenant: allinone.DevTenant, AdminToken: token(auth.ScopeAdmin), IngestToken: token(auth.ScopeIngest)},
		ops:    client.NewOperations(f.URL, allinone.DevTenant, token(auth.ScopeSend), nil),
		reader: client.NewReader(f.URL, allinone.DevTenant, token(auth.ScopeRead)),
		events: events,
		out:    newOutbound(t, ctx, f.NATSURL, data),
	}
}

// register registers a hosted client of a new account and subscribes to
// every kind of its events.
func (a *hostedApp) register(t *testing.T, ctx context.Context) (demo.Registered, *client.Subscription) {
	t.Helper()
	account := make([]byte, 32)
	_, _ = rand.Read(account)
	h := ok[demo.Registered](t)(a.api.Register(ctx, hex.EncodeToString(account)))
	return h, ok[*client.Subscription](t)(a.events.Subscribe(ctx, h.ClientID, schema.EventFilter{Kinds: schema.AllKinds()}))
}

// wantMembership reads the next event, a membership change of group that
// added and removed these inboxes (EVENT-024).
func wantMembership(t *testing.T, sub *client.Subscription, group []byte, added, removed []string) {
	t.Helper()
	mc := next(t, sub, schema.KindMembershipChanged).MembershipChanged
	slices.Sort(added)
	slices.Sort(removed)
	got := func(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }
	if !bytes.Equal(mc.GroupID, group) || !slices.Equal(got(mc.AddedInboxIDs), added) || !slices.Equal(got(mc.RemovedInboxIDs), removed) {
		t.Fatalf("membership_changed %+v, want added %v removed %v", mc, added, removed)
	}
}

// wantReceived reads the next event, message.received in group from
// sender of a content type (EVENT-018, EVENT-024).
func wantReceived(t *testing.T, sub *client.Subscription, group, id []byte, sender, typeID string) {
	t.Helper()
	mr := next(t, sub, schema.KindMessageReceived).MessageReceived
	if !bytes.Equal(mr.GroupID, group) || !bytes.Equal(mr.MessageID, id) || mr.SenderInboxID != sender ||
		mr.ContentType == nil || mr.ContentType.TypeID != typeID {
		t.Fatalf("message.received %+v, want %x from %s", mr, id, sender)
	}
}

// wantPublished reads the next event, message.status_changed unpublished →
// published of an own message in group (SEND), and returns its id.
func wantPublished(t *testing.T, sub *client.Subscription, group []byte) []byte {
	t.Helper()
	sc := next(t, sub, schema.KindMessageStatusChanged).MessageStatusChanged
	if !bytes.Equal(sc.GroupID, group) || sc.Previous != schema.StatusUnpublished || sc.Current != schema.StatusPublished || len(sc.MessageID) != 32 {
		t.Fatalf("message.status_changed %+v, want unpublished → published", sc)
	}
	return sc.MessageID
}

// wantMembers reads a client's member list of group: these inboxes.
func wantMembers(t *testing.T, reader *client.Reader, clientID string, group []byte, inboxes ...string) {
	t.Helper()
	ml := ok[schema.MemberList](t)(reader.Members(context.Background(), clientID, group))
	var got []string
	for _, m := range ml.Members {
		got = append(got, m.InboxID)
	}
	slices.Sort(got)
	slices.Sort(inboxes)
	if !slices.Equal(got, inboxes) {
		t.Fatalf("%s reads members %v, want %v", clientID, got, inboxes)
	}
}

// sentBy is a message and its sender's inbox.
type sentBy struct {
	id     []byte
	sender string
}

// wantMessages reads a client's messages of group, oldest first: these,
// delivered, with their texts.
func wantMessages(t *testing.T, reader *client.Reader, clientID string, group []byte, want []sentBy) {
	t.Helper()
	page := ok[schema.MessagePage](t)(reader.Messages(context.Background(), clientID, group, client.MessageQuery{}))
	if len(page.Messages) != len(want) {
		t.Fatalf("%s reads %d messages, want %d", clientID, len(page.Messages), len(want))
	}
	for i, m := range page.Messages {
		if !bytes.Equal(m.MessageID, want[i].id) || m.SenderInboxID != want[i].sender || m.State != schema.MessageStateDelivered ||
			m.Content == nil || (m.Content.Text == nil && m.Content.Reply == nil) {
			t.Fatalf("%s reads message %d %+v, want %x from %s", clientID, i, m, want[i].id, want[i].sender)
		}
	}
}

func text(t *testing.T, r testpeer.Received) string {
	t.Helper()
	s, err := r.Payload.Text()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// operationFinal waits for an operation's record to be done or failed.
func operationFinal(t testing.TB, ctx context.Context, ops *client.Operations, clientID string, id []byte) schema.Operation {
	t.Helper()
	var rec schema.Operation
	eventually.NoError(t, func() error {
		var err error
		if rec, err = ops.Operation(ctx, clientID, id); err != nil || (rec.Status != schema.OperationDone && rec.Status != schema.OperationFailed) {
			return fmt.Errorf("operation %+v (%v) has not finished", rec, err)
		}
		return nil
	})
	return rec
}

// settled waits for an input's outcome to be decided: rejected, or given
// a disposition by converge (outcome records follow the events they go
// with).
func settled(t *testing.T, ctx context.Context, base, token string, id []byte) schema.Outcome {
	t.Helper()
	var o schema.Outcome
	eventually.NoErrorWithin(t, 30*time.Second, func() error {
		if o = outcome(t, ctx, base, token, id); o.Status != schema.StatusRejected && o.Disposition == "" {
			return fmt.Errorf("outcome %+v not decided", o)
		}
		return nil
	})
	return o
}

// outcome reads an input's current outcome from the intake's outcome
// route (scope ingest); the zero outcome while it has none.
func outcome(t *testing.T, ctx context.Context, base, token string, id []byte) schema.Outcome {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/tenants/"+allinone.DevTenant+"/outcomes/"+hex.EncodeToString(id), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var o schema.Outcome
	if resp.StatusCode == http.StatusNotFound {
		return o
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("outcome of %x: %s", id, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		t.Fatal(err)
	}
	return o
}

// outbound reads what the fabric sent on a group's outbound subject, in
// order, as a transport bridge would (direct gets as the fanout user, who
// may read FABRIC_EVENTS).
type outbound struct {
	t    *testing.T
	ctx  context.Context
	js   jetstream.JetStream
	next uint64 // the stream sequence to read from
}

func newOutbound(t *testing.T, ctx context.Context, natsURL, data string) *outbound {
	t.Helper()
	pw, err := os.ReadFile(allinone.NATSPasswordFile(data, allinone.UserFanout))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(natsURL, nats.UserInfo(allinone.UserFanout, strings.TrimSpace(string(pw))), nats.CustomInboxPrefix(allinone.InboxPrefix(allinone.UserFanout)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return &outbound{t: t, ctx: ctx, js: ok[jetstream.JetStream](t)(jetstream.New(nc)), next: 1}
}

// read waits for the group's next n outbound messages.
func (o *outbound) read(group []byte, n int) []schema.TransportMessage {
	o.t.Helper()
	subj, err := subject.Outbound(allinone.DevTenant, hex.EncodeToString(group))
	if err != nil {
		o.t.Fatal(err)
	}
	var out []schema.TransportMessage
	eventually.NoErrorWithin(o.t, 30*time.Second, func() error {
		got, err := readmodel.Scan(o.ctx, o.js, streams.StreamEvents, subj, o.next, n-len(out))
		if err != nil {
			o.t.Fatal(err)
		}
		for _, s := range got {
			var tm schema.TransportMessage
			if err := tm.UnmarshalMsgpack(s.Data); err != nil {
				o.t.Fatal(err)
			}
			out = append(out, tm)
			o.next = s.Seq + 1
		}
		if len(out) < n {
			return fmt.Errorf("%d outbound messages, want %d", len(out), n)
		}
		return nil
	})
	return out
}

// peerReads has the peer process the group's next outbound message.
func (o *outbound) peerReads(g *testpeer.Group, group []byte) testpeer.Received {
	o.t.Helper()
	r, err := g.Process(o.read(group, 1)[0])
	if err != nil {
		o.t.Fatalf("the peer processes the next outbound message: %v", err)
	}
	return r
}
