package read_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/clientapi"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// readAfterEventReads is how many events the read-after-event test reads
// back from the event callback, at least.
const readAfterEventReads = 200

// put sends a client store request with the admin token.
func (fx *fixture) put(t testing.TB, path string, body any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPut, fx.f.URL+"/v1/tenants/dev/clients/"+fx.hosted.ClientID+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+fx.api.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT %s: %d", path, resp.StatusCode)
	}
}

// keyPackage makes one more KeyPackage of the hosted client.
func (fx *fixture) keyPackage(t testing.TB) []byte {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, fx.f.URL+"/v1/tenants/dev/clients/"+fx.hosted.ClientID+"/key-packages", strings.NewReader(`{"count":1}`))
	req.Header.Set("Authorization", "Bearer "+fx.api.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		KeyPackages []schema.Bytes `json:"key_packages"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.KeyPackages) != 1 {
		t.Fatalf("key packages: %d %v", resp.StatusCode, err)
	}
	return out.KeyPackages[0]
}

// secondReader serves the read API from a second instance, as another
// ingest -client-api process would: its own NATS connection, its own
// stores, nothing shared with the fabric's own API but JetStream.
func (fx *fixture) secondReader(t testing.TB) *client.Reader {
	t.Helper()
	verifier, err := auth.NewVerifier(fx.jwtSecret)
	if err != nil {
		t.Fatal(err)
	}
	vault, err := engine.NewVault(fx.masterKey)
	if err != nil {
		t.Fatal(err)
	}
	api, err := clientapi.New(context.Background(), clientapi.Config{JS: fx.natsAs(t, allinone.UserAPI), Vault: vault, Verifier: verifier, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	api.Mount(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return client.NewReader(srv.URL, allinone.DevTenant, fx.token)
}

// expected is the state the test's changes leave, per group (lowercase
// hex) and for the own inbox; the event callback reads against it.
type expected struct {
	mu       sync.Mutex
	names    map[string]string
	members  map[string][]string // sorted inbox ids; empty once removed
	floors   map[string]string   // the floor of a paused group
	ownInbox string
	ownKeys  [][]byte // the own inbox's installation keys held, in order
}

func (e *expected) set(f func(*expected)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(e)
}

// readCheck reads what an event of its kind reports, through one reader,
// and says what is stale: "" when the read saw the change.
type readCheck func(ctx context.Context, r *client.Reader, me string, ev schema.ClientEvent, e *expected) string

// readChecks are the kinds of the events spec (and the fabric's extension
// kinds) that report state the read API serves, each with its read.
// The spec's other kinds report no state the read API serves:
// message.status_changed, message.deleted with cause deleted_locally and
// the attachment.*, archive.restored, notifications.failed,
// client.rejected_by_server and client.lockout_changed kinds are a
// runtime's signals; hmac_keys.updated (the keys are the client's) and
// identity.registered (GET /clients/{client_id}) are read elsewhere;
// connection.state_changed and lagged are no stored state.
// conversation.fork_detected needs stored convergence state lost, which
// internal/converge's TestFORK040LostRetainedStateIsForked makes, and
// reads the client's record forked once the event is out.
var readChecks = map[schema.EventKind]readCheck{
	schema.KindConversationJoined:  checkConversation(nil),
	schema.KindMetadataChanged:     checkConversation(nil),
	schema.KindCommitSuperseded:    checkConversation(nil),
	schema.KindConversationPaused:  checkConversation(checkPaused),
	schema.KindConversationRemoved: checkConversation(checkRemoved),
	schema.KindMembershipChanged:   checkConversation(checkMembers),
	schema.KindMessageReceived: checkConversation(func(ctx context.Context, r *client.Reader, me string, ev schema.ClientEvent, _ *expected) string {
		id := ev.MessageReceived.MessageID
		if s := checkMessage(ctx, r, me, id, schema.MessageStateDelivered); s != "" {
			return s
		}
		p, err := r.Messages(ctx, me, ev.MessageReceived.GroupID, client.MessageQuery{Page: client.Page{Limit: 1}, Descending: true})
		if err != nil || len(p.Messages) != 1 || !bytes.Equal(p.Messages[0].MessageID, id) {
			return fmt.Sprintf("newest page %+v %v", p, err)
		}
		return ""
	}),
	schema.KindMessageDeleted: checkConversation(func(ctx context.Context, r *client.Reader, me string, ev schema.ClientEvent, _ *expected) string {
		return checkMessage(ctx, r, me, ev.MessageDeleted.MessageID, schema.MessageStateDeleted)
	}),
	schema.KindMessageExpired: checkConversation(func(ctx context.Context, r *client.Reader, me string, ev schema.ClientEvent, _ *expected) string {
		return checkMessage(ctx, r, me, ev.MessageExpired.MessageID, schema.MessageStateExpired)
	}),
	schema.KindMessageInvalidated: checkConversation(func(ctx context.Context, r *client.Reader, me string, ev schema.ClientEvent, _ *expected) string {
		return checkMessage(ctx, r, me, ev.MessageInvalidated.MessageID, schema.MessageStateInvalidated)
	}),
	schema.KindConsentChanged: func(ctx context.Context, r *client.Reader, me string, ev schema.ClientEvent, _ *expected) string {
		c := ev.ConsentChanged
		p, err := r.Consent(ctx, me, client.Page{Limit: 500})
		if err != nil || !slices.ContainsFunc(p.Consent, func(rec schema.ConsentRecord) bool {
			return rec.EntityKind == c.EntityKind && rec.Entity == c.Entity && rec.State == c.State
		}) {
			return fmt.Sprintf("consent %+v %v", p, err)
		}
		if c.EntityKind != schema.ConsentEntityConversation {
			return ""
		}
		gid, _ := hex.DecodeString(c.Entity)
		conv, err := r.Conversation(ctx, me, gid)
		if err != nil || conv.ConsentState != c.State {
			return fmt.Sprintf("conversation's consent %q %v", conv.ConsentState, err)
		}
		return ""
	},
	schema.KindHandleChanged: func(ctx context.Context, r *client.Reader, me string, ev schema.ClientEvent, _ *expected) string {
		h, ok, err := held(ctx, r, me, ev.HandleChanged.InboxID)
		if err != nil || !ok || h.DisplayHandle == nil || *h.DisplayHandle != ev.HandleChanged.Handle {
			return fmt.Sprintf("held %+v %v %v", h, ok, err)
		}
		return ""
	},
	schema.KindOwnInstallationAdded:   checkOwnKeys,
	schema.KindOwnInstallationRevoked: checkOwnKeys,
}

// checkConversation reads the event's conversation, alone and as the
// newest of the client's list, and then more, when more is not nil.
// Every transaction that emits an event of a group to a client rewrites
// the client's record of it, so that record is the newest of the list.
func checkConversation(more readCheck) readCheck {
	return func(ctx context.Context, r *client.Reader, me string, ev schema.ClientEvent, e *expected) string {
		gid, _ := ev.GroupID()
		c, err := r.Conversation(ctx, me, gid)
		if err != nil {
			return err.Error()
		}
		e.mu.Lock()
		name := e.names[hex.EncodeToString(gid)]
		e.mu.Unlock()
		if c.Components.GroupName == nil || *c.Components.GroupName != name {
			return fmt.Sprintf("name %v, want %s", c.Components.GroupName, name)
		}
		l, err := r.Conversations(ctx, me, client.ConversationQuery{Page: client.Page{Limit: 1}})
		if err != nil || len(l.Conversations) != 1 {
			return fmt.Sprintf("list %+v %v", l, err)
		}
		if f := l.Conversations[0]; !bytes.Equal(f.GroupID, gid) || f.LastActivity != c.LastActivity || f.Messages != c.Messages ||
			f.Epoch != c.Epoch || f.Membership != c.Membership || *f.Components.GroupName != name {
			return fmt.Sprintf("list's newest %+v, the conversation %+v", f, c)
		}
		if more == nil {
			return ""
		}
		return more(ctx, r, me, ev, e)
	}
}

func checkPaused(ctx context.Context, r *client.Reader, me string, ev schema.ClientEvent, e *expected) string {
	e.mu.Lock()
	floor := e.floors[hex.EncodeToString(ev.ConversationPaused.GroupID)]
	e.mu.Unlock()
	yes := true
	l, err := r.Conversations(ctx, me, client.ConversationQuery{Page: client.Page{Limit: 1}, Paused: &yes})
	if err != nil || len(l.Conversations) != 1 || l.Conversations[0].Paused == nil || l.Conversations[0].Paused.Floor != floor {
		return fmt.Sprintf("paused list %+v %v, want floor %s", l, err, floor)
	}
	return ""
}

func checkRemoved(ctx context.Context, r *client.Reader, me string, ev schema.ClientEvent, _ *expected) string {
	c, err := r.Conversation(ctx, me, ev.ConversationRemoved.GroupID)
	if err != nil || c.Membership != schema.MembershipRemoved {
		return fmt.Sprintf("membership %q %v", c.Membership, err)
	}
	return ""
}

func checkMembers(ctx context.Context, r *client.Reader, me string, ev schema.ClientEvent, e *expected) string {
	gid := ev.MembershipChanged.GroupID
	e.mu.Lock()
	want := e.members[hex.EncodeToString(gid)]
	e.mu.Unlock()
	l, err := r.Members(ctx, me, gid)
	if err != nil {
		return err.Error()
	}
	var got []string
	for _, m := range l.Members {
		got = append(got, m.InboxID)
	}
	if !slices.Equal(got, want) {
		return fmt.Sprintf("members %v, want %v", got, want)
	}
	return ""
}

// checkMessage reads a message by id: in state, with content only when
// delivered.
func checkMessage(ctx context.Context, r *client.Reader, me string, id []byte, state string) string {
	m, err := r.Message(ctx, me, id)
	if err != nil || m.State != state || (m.Content != nil) != (state == schema.MessageStateDelivered) {
		return fmt.Sprintf("message %x: %+v %v, want %s", id, m, err, state)
	}
	return ""
}

func checkOwnKeys(ctx context.Context, r *client.Reader, me string, _ schema.ClientEvent, e *expected) string {
	e.mu.Lock()
	inbox, want := e.ownInbox, slices.Clone(e.ownKeys)
	e.mu.Unlock()
	h, ok, err := held(ctx, r, me, inbox)
	if err != nil || !ok || !slices.EqualFunc(h.InstallationKeys, want, func(a schema.Bytes, b []byte) bool { return bytes.Equal(a, b) }) {
		return fmt.Sprintf("own keys %+v %v %v, want %x", h, ok, err, want)
	}
	return ""
}

// held is the association state a client holds for an inbox, from its
// identities.
func held(ctx context.Context, r *client.Reader, me, inbox string) (schema.Association, bool, error) {
	p, err := r.Identities(ctx, me, client.Page{Limit: 500})
	if err != nil {
		return schema.Association{}, false, err
	}
	for _, id := range p.Identities {
		if id.InboxID == inbox {
			return id.Held, true, nil
		}
	}
	return schema.Association{}, false, nil
}

// TestEVENT010ReadAfterEventFromCallback changes the hosted client's state
// through every kind readChecks names and reads each change from inside
// the SDK's event callback, at the moment the event is handed off, through
// two read API instances (the fabric's own and a second one on its own
// connection): of at least readAfterEventReads events, not one read may
// miss its change.
func TestEVENT010ReadAfterEventFromCallback(t *testing.T) {
	t.Parallel()
	// Converge's clock is held while a disappearing message is stored, as
	// in TestMETA063ExpiredMessageReadsExpired, then runs to expire it.
	var clock atomic.Int64
	fx := startWith(t, allinone.Options{ConvergeNow: heldClock(&clock)})
	readers := []struct {
		name string
		r    *client.Reader
	}{{"the fabric's API", fx.reader}, {"a second API instance", fx.secondReader(t)}}
	ctx := context.Background()
	me := fx.hosted.ClientID
	exp := &expected{names: map[string]string{}, members: map[string][]string{}, floors: map[string]string{},
		ownInbox: fx.hosted.InboxID, ownKeys: [][]byte{fx.hosted.InstallationKey}}

	type result struct {
		kind  schema.EventKind
		stale string
	}
	results := make(chan result, 64)
	sub, err := fx.events.SubscribeFunc(ctx, me, schema.EventFilter{Kinds: schema.AllKinds()}, func(ctx context.Context, ev schema.ClientEvent) error {
		check, ok := readChecks[ev.Kind]
		if !ok {
			results <- result{ev.Kind, "a kind the test makes no read of"}
			return nil
		}
		// Both instances read at once, each as an app's read would.
		stale := make([]string, len(readers))
		var wg sync.WaitGroup
		for i, r := range readers {
			wg.Go(func() {
				if s := check(ctx, r.r, me, ev, exp); s != "" {
					stale[i] = r.name + ": " + s
				}
			})
		}
		wg.Wait()
		results <- result{ev.Kind, strings.Join(slices.DeleteFunc(stale, func(s string) bool { return s == "" }), "; ")}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	read := map[schema.EventKind]int{}
	total := 0
	// step does what and reads its events until every kind of until has
	// arrived.
	step := func(what string, do func(), until ...schema.EventKind) {
		t.Helper()
		do()
		timeout := time.After(30 * time.Second)
		for len(until) > 0 {
			select {
			case r := <-results:
				if r.stale != "" {
					t.Fatalf("%s: %s: stale read: %s", what, r.kind, r.stale)
				}
				read[r.kind]++
				total++
				if i := slices.Index(until, r.kind); i >= 0 {
					until = slices.Delete(until, i, i+1)
				}
			case <-timeout:
				t.Fatalf("%s: no %v", what, until)
			}
		}
	}
	identity := func(inbox string, seq int, keys [][]byte, handle string) {
		t.Helper()
		body := map[string]any{"sequence_id": seq, "installation_keys": hexes(keys)}
		if handle != "" {
			body["display_handle"] = handle
		}
		fx.put(t, "/identities/"+inbox, body)
	}

	// The main group: alice, bob and the hosted client.
	alice, a, b, welcome := invited(t, fx, components.Set{Profile: &components.ProfileState{Name: "n0"}})
	bob := b.Peer()
	admins := []components.AccountID{alice.AccountID()}
	gid := hex.EncodeToString(a.ID())
	exp.set(func(e *expected) { e.names[gid] = "n0" })
	// The first association state held for an inbox emits nothing.
	identity(bob.InboxID(), 1, [][]byte{bob.InstallationKey()}, "")
	identity(fx.hosted.InboxID, 1, [][]byte{fx.hosted.InstallationKey}, "")
	step("joined", func() { fx.post(t, welcome) }, schema.KindConversationJoined)

	// A group whose messages disappear after a second (META-063).
	_, d, db, dwelcome := invitedBy(t, fx, alice, components.Set{Profile: &components.ProfileState{Name: "disappearing"}, Retention: &components.RetentionState{DisappearingSecs: 1}}, fx.keyPackage(t))
	exp.set(func(e *expected) { e.names[hex.EncodeToString(d.ID())] = "disappearing" })
	step("joined the disappearing group", func() { fx.post(t, dwelcome) }, schema.KindConversationJoined)

	var sent []testpeer.Message
	extra := make([]byte, 32)
	_, _ = rand.Read(extra)
	for i := 2; total < readAfterEventReads; i++ {
		switch i % 16 {
		case 1: // metadata
			name := fmt.Sprintf("n%d", i)
			exp.set(func(e *expected) { e.names[gid] = name })
			m, err := a.SetComponents(components.Set{Profile: &components.ProfileState{Name: name}, Admins: admins})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Process(m.Transport); err != nil {
				t.Fatal(err)
			}
			step("rename", func() { fx.post(t, m) }, schema.KindMetadataChanged)
		case 3: // consent
			state := []string{"allowed", "denied"}[i/16%2]
			step("consent", func() {
				fx.put(t, "/consent", map[string]string{"entity_kind": "conversation", "entity": gid, "state": state})
			}, schema.KindConsentChanged)
		case 5: // a handle
			step("handle", func() {
				identity(bob.InboxID(), i, [][]byte{bob.InstallationKey()}, fmt.Sprintf("bob%d", i))
			}, schema.KindHandleChanged)
		case 7: // an own installation added, or revoked
			keys, kind := [][]byte{fx.hosted.InstallationKey, extra}, schema.KindOwnInstallationAdded
			if i/16%2 == 1 {
				keys, kind = keys[:1], schema.KindOwnInstallationRevoked
			}
			exp.set(func(e *expected) { e.ownKeys = keys })
			step("own installation", func() { identity(fx.hosted.InboxID, i, keys, "") }, kind)
		case 9: // a member added, then removed
			carol, err := testpeer.New("carol")
			if err != nil {
				t.Fatal(err)
			}
			add, _, err := a.Add(carol)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Process(add.Transport); err != nil {
				t.Fatal(err)
			}
			with := []string{alice.InboxID(), bob.InboxID(), fx.hosted.InboxID}
			slices.Sort(with)
			exp.set(func(e *expected) {
				e.members[gid] = slices.Sorted(slices.Values(append(slices.Clone(with), carol.InboxID())))
			})
			step("member added", func() { fx.post(t, add) }, schema.KindMembershipChanged)
			rm, err := a.Remove(carol.InboxID())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Process(rm.Transport); err != nil {
				t.Fatal(err)
			}
			exp.set(func(e *expected) { e.members[gid] = with })
			step("member removed", func() { fx.post(t, rm) }, schema.KindMembershipChanged)
		case 11: // a deletion: message.received (the deletion), message.deleted
			if len(sent) == 0 {
				continue
			}
			del, err := b.SendDelete(sent[len(sent)-1].ID)
			if err != nil {
				t.Fatal(err)
			}
			sent = sent[:len(sent)-1]
			step("deletion", func() { fx.post(t, del) }, schema.KindMessageReceived, schema.KindMessageDeleted)
		case 13: // a disappearing message, received on the held clock, then expired
			if i/16%2 == 1 {
				continue
			}
			m, err := db.SendText(fmt.Sprintf("gone %d", i))
			if err != nil {
				t.Fatal(err)
			}
			clock.Store(time.Now().UnixMilli())
			step("disappearing message", func() { fx.post(t, m) }, schema.KindMessageReceived)
			step("expiry", func() { clock.Store(0) }, schema.KindMessageExpired)
		default:
			m, err := b.SendText(fmt.Sprintf("m%d", i))
			if err != nil {
				t.Fatal(err)
			}
			sent = append(sent, m)
			step("message", func() { fx.post(t, m) }, schema.KindMessageReceived)
		}
	}

	// A rollback: a message and a rename on a branch that a deeper branch
	// beats read invalidated and the winner's name (Marmot convergence).
	ralice, r, _, rwelcome := invitedBy(t, fx, alice, components.Set{Profile: &components.ProfileState{Name: "start"}}, fx.keyPackage(t))
	rgid := hex.EncodeToString(r.ID())
	exp.set(func(e *expected) { e.names[rgid] = "start" })
	step("joined the group that forks", func() { fx.post(t, rwelcome) }, schema.KindConversationJoined)
	loser, winner := branches(t, ralice, r)
	exp.set(func(e *expected) { e.names[rgid] = "loser" })
	step("the losing rename", func() { fx.post(t, loser) }, schema.KindMetadataChanged)
	onLoser, err := r.SendText("on the branch that loses")
	if err != nil {
		t.Fatal(err)
	}
	step("a message on the losing branch", func() { fx.post(t, onLoser) }, schema.KindMessageReceived)
	exp.set(func(e *expected) { e.names[rgid] = "winner" })
	step("rollback", func() { fx.post(t, winner...) }, schema.KindMessageInvalidated, schema.KindCommitSuperseded, schema.KindMetadataChanged)

	// Paused: the group's protocol version floor above the fabric's.
	floor := "9.0.0"
	exp.set(func(e *expected) { e.floors[gid] = floor })
	exp.mu.Lock()
	name := exp.names[gid]
	exp.mu.Unlock()
	pause, err := a.SetComponents(components.Set{Profile: &components.ProfileState{Name: name}, Admins: admins, ProtocolFloor: &floor})
	if err != nil {
		t.Fatal(err)
	}
	step("paused", func() { fx.post(t, pause) }, schema.KindConversationPaused)

	// The hosted client removed: conversation.removed, then
	// membership_changed with no roster left to read.
	rm, err := a.Remove(fx.hosted.InboxID)
	if err != nil {
		t.Fatal(err)
	}
	exp.set(func(e *expected) { e.members[gid] = nil })
	step("removed", func() { fx.post(t, rm) }, schema.KindConversationRemoved, schema.KindMembershipChanged)

	for k := range readChecks {
		if read[k] == 0 {
			t.Errorf("no %s read", k)
		}
	}
	if total < readAfterEventReads {
		t.Errorf("%d events read, want %d", total, readAfterEventReads)
	}
	t.Logf("%d events read from the callback through %d instances: %v", total, len(readers), read)
}

func hexes(keys [][]byte) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = hex.EncodeToString(k)
	}
	return out
}
