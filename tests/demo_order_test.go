package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// TestEVENT012DemoFlowInCanonicalOrder drives the demo's conversation 30
// times into one in-process fabric, with fresh members (so fresh message
// ids) and the inputs one convergence pass settles (rename, bob's message,
// its deletion, bob's leave request and its commit) arriving shuffled in
// one transport request. Every run must hand off the same full event list
// in the order the changes were made (EVENT-012): the deletion's
// message.deleted after its target (PROC-037) whatever the ids, and bob's
// removal after the message he sent in the epoch before it. Messages
// delivered on arrival (the talk before the rename) arrive in order.
func TestEVENT012DemoFlowInCanonicalOrder(t *testing.T) {
	t.Parallel()
	oneInProcess(t)
	const runs = 30
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := startInProcess(t, ctx)
	admin := must(t)(f.Token(time.Hour, auth.ScopeAdmin))
	ingest := must(t)(f.Token(time.Hour, auth.ScopeIngest))
	events := must(t)(f.Token(time.Hour, auth.ScopeEvents))
	api := &demo.API{BaseURL: f.URL, Tenant: allinone.DevTenant, AdminToken: admin, IngestToken: ingest}
	c, err := client.Connect(ctx, "ws"+strings.TrimPrefix(f.URL, "http")+"/v1/events", events)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	seed := uint64(time.Now().UnixNano())
	t.Logf("shuffle seed %d", seed)
	var wg sync.WaitGroup
	errs := make([]error, runs)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = demoRun(ctx, api, c, mrand.New(mrand.NewPCG(seed, uint64(i))))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("run %d: %v", i, err)
		}
	}
}

func must(t *testing.T) func(string, error) string {
	return func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// demoRun plays one demo conversation and checks its events.
func demoRun(ctx context.Context, api *demo.API, c *client.Client, rng *mrand.Rand) error {
	account := make([]byte, 32)
	rand.Read(account)
	hosted, err := api.Register(ctx, hex.EncodeToString(account))
	if err != nil {
		return err
	}
	sub, err := c.Subscribe(ctx, hosted.ClientID, schema.EventFilter{Kinds: schema.AllKinds()})
	if err != nil {
		return err
	}
	fl, err := demo.NewFlow(hosted)
	if err != nil {
		return err
	}
	post := func(steps []demo.Step) error {
		var msgs []schema.TransportMessage
		for _, s := range steps {
			msgs = append(msgs, s.Msg.Transport)
		}
		_, err := api.Post(ctx, msgs...)
		return err
	}
	want := wantDemoEvents(fl)
	var got []schema.ClientEvent
	read := func(n int) error {
		for len(got) < n {
			ev, err := sub.Next(ctx)
			if err != nil {
				return fmt.Errorf("after %d events: %w", len(got), err)
			}
			got = append(got, ev)
		}
		return nil
	}
	// The Welcome is processed before the group's traffic is taken in.
	if err := post(fl.Join); err != nil {
		return err
	}
	if err := read(1); err != nil {
		return err
	}
	if err := post(fl.Talk); err != nil {
		return err
	}
	settle := append([]demo.Step(nil), fl.Settle...)
	rng.Shuffle(len(settle), func(i, j int) { settle[i], settle[j] = settle[j], settle[i] })
	if err := post(settle); err != nil {
		return err
	}
	if err := read(len(want)); err != nil {
		return fmt.Errorf("%w (events %v; the settle inputs' outcomes, in posting order: %s)", err, kindList(got), settleOutcomes(api, settle))
	}
	ids := make(map[string]bool, len(got))
	for i := range want {
		// The event id (the Nats-Msg-Id) is derived from fresh message ids;
		// each event carries one, once.
		if got[i].ID == "" || ids[got[i].ID] {
			return fmt.Errorf("event %d %s has id %q, empty or given before", i, got[i].Kind, got[i].ID)
		}
		ids[got[i].ID] = true
		got[i].ID = ""
		if !reflect.DeepEqual(got[i], want[i]) {
			return fmt.Errorf("event %d is %s %s, want %s %s (events %v)", i, got[i].Kind, payload(got[i]), want[i].Kind, payload(want[i]), kindList(got))
		}
	}
	// Nothing follows.
	quiet, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if ev, err := sub.Next(quiet); err == nil {
		return fmt.Errorf("an extra event %s %s", ev.Kind, payload(ev))
	}
	return nil
}

// settleOutcomes reads each settle input's outcome from the intake, so a
// run that stops short says whether converge decided its inputs (an event
// lost on the way) or not (a pass never applied).
func settleOutcomes(api *demo.API, steps []demo.Step) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []string
	for _, st := range steps {
		o, err := readOutcome(ctx, api, st.Msg.ID)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", st.Name, err))
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s/%s%s", st.Name, o.Status, o.Disposition, o.Category))
	}
	return strings.Join(out, "; ")
}

func readOutcome(ctx context.Context, api *demo.API, id []byte) (schema.Outcome, error) {
	var o schema.Outcome
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.BaseURL+"/v1/tenants/"+api.Tenant+"/outcomes/"+hex.EncodeToString(id), nil)
	if err != nil {
		return o, err
	}
	req.Header.Set("Authorization", "Bearer "+api.IngestToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return o, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return o, nil
	}
	if resp.StatusCode != http.StatusOK {
		return o, fmt.Errorf("outcome: %s", resp.Status)
	}
	return o, json.NewDecoder(resp.Body).Decode(&o)
}

// wantDemoEvents is the hosted client's full event list of the demo
// conversation, in the order its changes were made.
func wantDemoEvents(fl *demo.Flow) []schema.ClientEvent {
	gid := schema.Bytes(fl.GroupID)
	ct := func(c apppayload.ContentType) *schema.ContentTypeID {
		return &schema.ContentTypeID{AuthorityID: c.AuthorityID, TypeID: c.TypeID, VersionMajor: c.VersionMajor}
	}
	received := func(id []byte, from string, c apppayload.ContentType) schema.ClientEvent {
		return schema.ClientEvent{Kind: schema.KindMessageReceived, MessageReceived: &schema.MessageReceived{
			GroupID: gid, MessageID: schema.Bytes(id), ContentType: ct(c), SenderInboxID: from,
		}}
	}
	adder := fl.Alice.InboxID()
	bob := fl.Bob.InboxID()
	changed := components.Diff(
		components.Set{Profile: &components.ProfileState{Name: "demo"}, Admins: []components.AccountID{fl.Alice.AccountID()}},
		components.Set{Profile: &components.ProfileState{Name: "demo, renamed", Description: "a fabric demo"}, Admins: []components.AccountID{fl.Alice.AccountID()}})
	return []schema.ClientEvent{
		{Kind: schema.KindConversationJoined, ConversationJoined: &schema.ConversationJoined{
			GroupID: gid, ConversationType: schema.ConversationGroup, Origin: schema.OriginWelcomed, AdderInboxID: &adder,
		}},
		received(fl.Hello.ID, bob, apppayload.TextType),
		received(fl.Reply.ID, fl.Alice.InboxID(), apppayload.ReplyType),
		received(fl.React.ID, bob, apppayload.ReactionType),
		{Kind: schema.KindMetadataChanged, MetadataChanged: &schema.MetadataChanged{GroupID: gid, Changed: changed}},
		received(fl.Oops.ID, bob, apppayload.TextType),
		received(fl.Delete.ID, bob, apppayload.DeletionType),
		{Kind: schema.KindMessageDeleted, MessageDeleted: &schema.MessageDeleted{GroupID: gid, MessageID: schema.Bytes(fl.Oops.ID), Cause: schema.DeletionDeleted}},
		{Kind: schema.KindMembershipChanged, MembershipChanged: &schema.MembershipChanged{GroupID: gid, AddedInboxIDs: []string{}, RemovedInboxIDs: []string{bob}}},
	}
}

func payload(ev schema.ClientEvent) string {
	b, _ := ev.MarshalJSON()
	return string(b)
}

func kindList(evs []schema.ClientEvent) []schema.EventKind {
	out := make([]schema.EventKind, len(evs))
	for i, e := range evs {
		out[i] = e.Kind
	}
	return out
}

// TestDemoAtPauseZeroKeepsSendOrder is issue 26 item 6: `fabric demo -pause
// 0` posts each step as soon as the one before is answered, so bob's hello
// arrives while the hosted client's Welcome is not yet processed (the
// group is unknown_group, the hello retained) and the reply may arrive
// once the group is known but before the hello is backfilled. Every run
// must hand off the events in the order the messages were sent, and the
// read API must number the messages in that order. The race is made
// deterministic in internal/ingest
// (TestRetainedInputIsBackfilledBeforeLaterInputOfItsGroup); here the demo
// itself plays it, 10 conversations at once, as the command does.
func TestDemoAtPauseZeroKeepsSendOrder(t *testing.T) {
	t.Parallel()
	oneInProcess(t)
	const runs = 10
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := startInProcess(t, ctx)
	admin := must(t)(f.Token(time.Hour, auth.ScopeAdmin))
	ingest := must(t)(f.Token(time.Hour, auth.ScopeIngest))
	events := must(t)(f.Token(time.Hour, auth.ScopeEvents))
	reader := client.NewReader(f.URL, allinone.DevTenant, must(t)(f.Token(time.Hour, auth.ScopeRead)))
	api := &demo.API{BaseURL: f.URL, Tenant: allinone.DevTenant, AdminToken: admin, IngestToken: ingest}
	c, err := client.Connect(ctx, "ws"+strings.TrimPrefix(f.URL, "http")+"/v1/events", events)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	errs := make([]error, runs)
	for i := range runs {
		wg.Go(func() { errs[i] = demoAtPauseZero(ctx, api, c, reader) })
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			t.Errorf("run %d: %v", i, err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d runs out of the send order", failed, runs)
	}
}

// demoAtPauseZero plays one demo conversation without pauses and checks
// its events and the read API's messages against the send order.
func demoAtPauseZero(ctx context.Context, api *demo.API, c *client.Client, reader *client.Reader) error {
	account := make([]byte, 32)
	rand.Read(account)
	hosted, err := api.Register(ctx, hex.EncodeToString(account))
	if err != nil {
		return err
	}
	sub, err := c.Subscribe(ctx, hosted.ClientID, schema.EventFilter{Kinds: schema.AllKinds()})
	if err != nil {
		return err
	}
	fl, err := demo.NewFlow(hosted)
	if err != nil {
		return err
	}
	if err := (&demo.Script{API: api}).PlayFlow(ctx, fl); err != nil {
		return err
	}
	want := wantDemoEvents(fl)
	var got []schema.ClientEvent
	for len(got) < len(want) {
		ev, err := sub.Next(ctx)
		if err != nil {
			return fmt.Errorf("after %d events %v: %w", len(got), kindList(got), err)
		}
		ev.ID = ""
		got = append(got, ev)
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			return fmt.Errorf("event %d is %s %s, want %s %s", i, got[i].Kind, payload(got[i]), want[i].Kind, payload(want[i]))
		}
	}
	page, err := reader.Messages(ctx, hosted.ClientID, fl.GroupID, client.MessageQuery{})
	if err != nil {
		return err
	}
	sent := [][]byte{fl.Hello.ID, fl.Reply.ID, fl.React.ID, fl.Oops.ID, fl.Delete.ID}
	if len(page.Messages) != len(sent) {
		return fmt.Errorf("the read API holds %d messages, want %d", len(page.Messages), len(sent))
	}
	for i, m := range page.Messages {
		if !bytes.Equal(m.MessageID, sent[i]) || m.DeliveryNumber != uint64(i+1) {
			return fmt.Errorf("read API message %d is %x (delivery number %d), want %x numbered %d", i, m.MessageID[:4], m.DeliveryNumber, sent[i][:4], i+1)
		}
	}
	return nil
}
