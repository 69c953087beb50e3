package read_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// readAfterEventRounds is how many state changes the read-after-event
// test reads back from the event callback.
const readAfterEventRounds = 200

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

// TestEVENT010ReadAfterEventFromCallback changes the hosted client's state
// readAfterEventRounds times, through every kind that reports stored
// state, and reads the change from inside the SDK's event callback, at
// the moment the event is handed off: not one read may miss its change.
func TestEVENT010ReadAfterEventFromCallback(t *testing.T) {
	fx := start(t)
	ctx := context.Background()
	alice, a, b, welcome := invited(t, fx, components.Set{Profile: &components.ProfileState{Name: "n0"}})
	bob := b.Peer()
	carol, err := testpeer.New("carol")
	if err != nil {
		t.Fatal(err)
	}
	admins := []components.AccountID{alice.AccountID()}
	gid := a.ID()
	me := fx.hosted.ClientID

	// The callback checks each event against what a read returns, and
	// reports one line per event: "" when the read saw the change.
	results := make(chan string, 16)
	var wantName string
	var wantMembers []string
	sub, err := fx.events.SubscribeFunc(ctx, me, schema.EventFilter{Kinds: schema.AllKinds()}, func(ctx context.Context, ev schema.ClientEvent) error {
		results <- check(ctx, fx, ev, gid, wantName, wantMembers)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	step := func(what string, do func()) {
		t.Helper()
		do()
		select {
		case r := <-results:
			if r != "" {
				t.Fatalf("%s: stale read: %s", what, r)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no event", what)
		}
	}
	// The first association state held for an inbox emits nothing.
	fx.put(t, "/identities/"+bob.InboxID(), map[string]any{"sequence_id": 1, "installation_keys": []string{hex.EncodeToString(bob.InstallationKey())}})
	wantName = "n0"
	step("joined", func() { fx.post(t, welcome) })
	var sent []testpeer.Message
	for i := range readAfterEventRounds {
		switch {
		case i%50 == 10: // metadata
			wantName = fmt.Sprintf("n%d", i)
			m, err := a.SetComponents(components.Set{Profile: &components.ProfileState{Name: wantName}, Admins: admins})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Process(m.Transport); err != nil {
				t.Fatal(err)
			}
			step("rename", func() { fx.post(t, m) })
		case i%50 == 20: // consent
			state := []string{"allowed", "denied"}[i/50%2]
			step("consent", func() {
				fx.put(t, "/consent", map[string]string{"entity_kind": "conversation", "entity": hex.EncodeToString(gid), "state": state})
			})
		case i%50 == 30: // identity: a handle change
			step("handle", func() {
				fx.put(t, "/identities/"+bob.InboxID(), map[string]any{"sequence_id": i, "installation_keys": []string{hex.EncodeToString(bob.InstallationKey())}, "display_handle": fmt.Sprintf("bob%d", i)})
			})
		case i%50 == 40 && len(sent) > 0: // deletion
			del, err := b.SendDelete(sent[len(sent)-1].ID)
			if err != nil {
				t.Fatal(err)
			}
			fx.post(t, del)
			// message.received (the deletion), then message.deleted
			step("deletion received", func() {})
			step("deleted", func() {})
			sent = sent[:len(sent)-1]
		default:
			m, err := b.SendText(fmt.Sprintf("m%d", i))
			if err != nil {
				t.Fatal(err)
			}
			sent = append(sent, m)
			step("message", func() { fx.post(t, m) })
		}
	}
	// Membership: carol added, then the hosted client removed.
	add, _, err := a.Add(carol)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Process(add.Transport); err != nil {
		t.Fatal(err)
	}
	wantMembers = []string{alice.InboxID(), bob.InboxID(), carol.InboxID(), fx.hosted.InboxID}
	slices.Sort(wantMembers)
	step("carol added", func() { fx.post(t, add) })
	rm, err := a.Remove(fx.hosted.InboxID)
	if err != nil {
		t.Fatal(err)
	}
	step("removed", func() { fx.post(t, rm) })
}

// check reads what ev reports and says what is stale, "" when nothing.
func check(ctx context.Context, fx *fixture, ev schema.ClientEvent, gid []byte, name string, members []string) string {
	r, me := fx.reader, fx.hosted.ClientID
	switch ev.Kind {
	case schema.KindConversationJoined, schema.KindMetadataChanged:
		c, err := r.Conversation(ctx, me, gid)
		if err != nil {
			return err.Error()
		}
		if c.Components.GroupName == nil || *c.Components.GroupName != name {
			return fmt.Sprintf("%s: name %v, want %s", ev.Kind, c.Components.GroupName, name)
		}
		l, err := r.Conversations(ctx, me, client.ConversationQuery{Page: client.Page{Limit: 1}})
		if err != nil || len(l.Conversations) != 1 || *l.Conversations[0].Components.GroupName != name {
			return fmt.Sprintf("%s: list %+v %v", ev.Kind, l, err)
		}
	case schema.KindMessageReceived:
		m, err := r.Message(ctx, me, ev.MessageReceived.MessageID)
		if err != nil {
			return "message.received: " + err.Error()
		}
		if m.State != schema.MessageStateDelivered || m.Content == nil {
			return fmt.Sprintf("message.received: %+v", m)
		}
		p, err := r.Messages(ctx, me, gid, client.MessageQuery{Page: client.Page{Limit: 1}, Descending: true})
		if err != nil || len(p.Messages) != 1 || !bytes.Equal(p.Messages[0].MessageID, ev.MessageReceived.MessageID) {
			return fmt.Sprintf("message.received: newest page %+v %v", p, err)
		}
	case schema.KindMessageDeleted:
		m, err := r.Message(ctx, me, ev.MessageDeleted.MessageID)
		if err != nil || m.State != schema.MessageStateDeleted || m.Content != nil {
			return fmt.Sprintf("message.deleted: %+v %v", m, err)
		}
	case schema.KindConsentChanged:
		p, err := r.Consent(ctx, me, client.Page{})
		if err != nil || len(p.Consent) != 1 || p.Consent[0].State != ev.ConsentChanged.State {
			return fmt.Sprintf("consent.changed: %+v %v", p, err)
		}
		c, err := r.Conversation(ctx, me, gid)
		if err != nil || c.ConsentState != ev.ConsentChanged.State {
			return fmt.Sprintf("consent.changed: conversation %+v %v", c.ConsentState, err)
		}
	case schema.KindHandleChanged:
		p, err := r.Identities(ctx, me, client.Page{})
		if err != nil || len(p.Identities) != 1 || p.Identities[0].Held.DisplayHandle == nil || *p.Identities[0].Held.DisplayHandle != ev.HandleChanged.Handle {
			return fmt.Sprintf("handle.changed: %+v %v", p, err)
		}
	case schema.KindMembershipChanged:
		l, err := r.Members(ctx, me, gid)
		if err != nil {
			return err.Error()
		}
		var got []string
		for _, m := range l.Members {
			got = append(got, m.InboxID)
		}
		if !slices.Equal(got, members) {
			return fmt.Sprintf("membership_changed: %v, want %v", got, members)
		}
	case schema.KindConversationRemoved:
		c, err := r.Conversation(ctx, me, gid)
		if err != nil || c.Membership != schema.MembershipRemoved {
			return fmt.Sprintf("removed: %+v %v", c, err)
		}
	default:
		return "unexpected " + strings.ToLower(string(ev.Kind))
	}
	return ""
}
