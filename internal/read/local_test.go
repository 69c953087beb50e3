package read_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// signal reports a ClientEvent for the hosted client through the signals
// endpoint under key and returns the status.
func (fx *fixture) signal(t *testing.T, key string, ev schema.ClientEvent) int {
	t.Helper()
	b, err := ev.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := fx.f.Token(time.Hour, auth.ScopeSignals)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, fx.f.URL+"/v1/tenants/"+allinone.DevTenant+"/clients/"+fx.hosted.ClientID+"/signals", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.ReadAll(resp.Body)
	return resp.StatusCode
}

// Issue 26 item 8: the read API serves what the signals change. An own
// message carries its status: published once sent (the fabric's
// message.status_changed), then what an accepted message.status_changed
// signal made it; another member's message carries none. A message the
// client deleted locally (message.deleted, cause deleted_locally) reads
// as deleted_locally, without content, by id and in its page; the group's
// other messages are as they were.
func TestLocalSignalsChangeWhatTheReadAPIReturns(t *testing.T) {
	t.Parallel()
	fx := start(t)
	ctx := context.Background()
	ch := fx.collect(t)
	flow, err := demo.NewFlow(fx.hosted)
	if err != nil {
		t.Fatal(err)
	}
	fx.post(t, flow.Join[2].Msg)
	await(t, ch, schema.KindConversationJoined)
	fx.post(t, flow.Hello, flow.Reply)
	await(t, ch, schema.KindMessageReceived)
	await(t, ch, schema.KindMessageReceived)

	sendTok, err := fx.f.Token(time.Hour, auth.ScopeSend)
	if err != nil {
		t.Fatal(err)
	}
	ops := client.NewOperations(fx.f.URL, allinone.DevTenant, sendTok, nil)
	if _, err := ops.SendText(ctx, fx.hosted.ClientID, flow.GroupID, "own-1", "from the hosted client"); err != nil {
		t.Fatal(err)
	}
	sent := await(t, ch, schema.KindMessageStatusChanged).MessageStatusChanged
	own, err := fx.reader.Message(ctx, fx.hosted.ClientID, sent.MessageID)
	if err != nil || own.Status != schema.StatusPublished {
		t.Fatalf("own message %+v %v, want status published", own, err)
	}
	hello, err := fx.reader.Message(ctx, fx.hosted.ClientID, flow.Hello.ID)
	if err != nil || hello.Status != "" {
		t.Fatalf("bob's hello %+v %v, want no status", hello, err)
	}

	failed := schema.ClientEvent{Kind: schema.KindMessageStatusChanged, MessageStatusChanged: &schema.MessageStatusChanged{
		GroupID: flow.GroupID, MessageID: sent.MessageID, Previous: schema.StatusPublished, Current: schema.StatusFailed}}
	if st := fx.signal(t, "fail-1", failed); st != http.StatusOK {
		t.Fatalf("published -> failed: %d", st)
	}
	await(t, ch, schema.KindMessageStatusChanged)
	if own, err = fx.reader.Message(ctx, fx.hosted.ClientID, sent.MessageID); err != nil || own.Status != schema.StatusFailed {
		t.Fatalf("own message after the signal %+v %v, want status failed", own, err)
	}

	local := schema.ClientEvent{Kind: schema.KindMessageDeleted, MessageDeleted: &schema.MessageDeleted{
		GroupID: flow.GroupID, MessageID: flow.Hello.ID, Cause: schema.DeletionDeletedLocally}}
	if st := fx.signal(t, "local-1", local); st != http.StatusOK {
		t.Fatalf("local deletion: %d", st)
	}
	await(t, ch, schema.KindMessageDeleted)
	if hello, err = fx.reader.Message(ctx, fx.hosted.ClientID, flow.Hello.ID); err != nil ||
		hello.State != schema.MessageStateDeletedLocally || hello.Content != nil || hello.ContentType != nil {
		t.Fatalf("hello after its local deletion %+v %v, want deleted_locally without content", hello, err)
	}
	page, err := fx.reader.Messages(ctx, fx.hosted.ClientID, flow.GroupID, client.MessageQuery{})
	if err != nil || len(page.Messages) != 3 {
		t.Fatalf("page %+v %v", page, err)
	}
	for i, want := range []struct {
		id     []byte
		state  string
		status schema.MessageStatus
	}{
		{flow.Hello.ID, schema.MessageStateDeletedLocally, ""},
		{flow.Reply.ID, schema.MessageStateDelivered, ""},
		{sent.MessageID, schema.MessageStateDelivered, schema.StatusFailed},
	} {
		m := page.Messages[i]
		if !bytes.Equal(m.MessageID, want.id) || m.State != want.state || m.Status != want.status || (want.state == schema.MessageStateDelivered) != (m.Content != nil) {
			t.Errorf("page message %d: %s %s %q content %v, want %s %s %q", i, hex.EncodeToString(m.MessageID[:4]), m.State, m.Status, m.Content != nil, hex.EncodeToString(want.id[:4]), want.state, want.status)
		}
	}
}
