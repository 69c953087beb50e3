package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Issue 19 through the HTTP API and the Go SDK: a hosted client creates a
// group with a remote member ({"name": …} and its KeyPackage) and sends a
// text. The SDK's subscription sees conversation.joined with origin
// created (EVENT-005), the remote member added once the own commit came
// back and was accepted, and the text's status published; the operation
// records say done. The same Idempotency-Key is the same operation; a
// token without send (or admin) scope (403), no Idempotency-Key or a
// KeyPackage that does not parse (400), or a client the tenant does not
// host (404) is refused.
func TestSDKCreatesConversationAndSends(t *testing.T) {
	t.Parallel()
	oneInProcess(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := startInProcess(t, ctx)
	admin := ok[string](t)(f.Token(time.Hour, auth.ScopeAdmin))
	send := ok[string](t)(f.Token(time.Hour, auth.ScopeSend))
	events := ok[string](t)(f.Token(time.Hour, auth.ScopeEvents))
	api := &demo.API{BaseURL: f.URL, Tenant: allinone.DevTenant, AdminToken: admin}
	account := make([]byte, 32)
	_, _ = rand.Read(account)
	hosted := ok[demo.Registered](t)(api.Register(ctx, hex.EncodeToString(account)))
	c := ok[*client.Client](t)(client.Connect(ctx, "ws"+strings.TrimPrefix(f.URL, "http")+"/v1/events", events))
	defer func() { _ = c.Close() }()
	sub := ok[*client.Subscription](t)(c.Subscribe(ctx, hosted.ClientID, schema.EventFilter{Kinds: schema.AllKinds()}))

	bob := ok[*testpeer.Peer](t)(testpeer.New("bob"))
	kp := ok[[]byte](t)(bob.KeyPackage())
	ops := client.NewOperations(f.URL, allinone.DevTenant, send, nil)
	name := "team"
	body := schema.CreateConversation{Name: &name, KeyPackages: []schema.Bytes{kp}}
	created := ok[schema.OperationAccepted](t)(ops.CreateConversation(ctx, hosted.ClientID, "create-1", body))
	again := ok[schema.OperationAccepted](t)(ops.CreateConversation(ctx, hosted.ClientID, "create-1", body))
	if !bytes.Equal(again.OperationID, created.OperationID) || !bytes.Equal(again.GroupID, created.GroupID) || created.Status != schema.OperationQueued {
		t.Fatalf("the same Idempotency-Key answered %+v then %+v", created, again)
	}
	j := next(t, sub, schema.KindConversationJoined).ConversationJoined
	if j.Origin != schema.OriginCreated || !bytes.Equal(j.GroupID, created.GroupID) || j.AdderInboxID != nil {
		t.Fatalf("conversation.joined %+v, want origin created", j)
	}
	mc := next(t, sub, schema.KindMembershipChanged).MembershipChanged
	if !slices.Equal(mc.AddedInboxIDs, []string{bob.InboxID()}) {
		t.Fatalf("membership_changed %+v, want bob added", mc)
	}

	sent := ok[schema.OperationAccepted](t)(ops.SendText(ctx, hosted.ClientID, created.GroupID, "send-1", "hello"))
	sc := next(t, sub, schema.KindMessageStatusChanged).MessageStatusChanged
	if sc.Previous != schema.StatusUnpublished || sc.Current != schema.StatusPublished || !bytes.Equal(sc.GroupID, created.GroupID) {
		t.Fatalf("message.status_changed %+v", sc)
	}
	rec := operationDone(t, ctx, ops, hosted.ClientID, sent.OperationID)
	if rec.Kind != schema.OpSendMessage || len(rec.MessageIDs) != 1 || !bytes.Equal(rec.MessageIDs[0], sc.MessageID) {
		t.Fatalf("send record %+v", rec)
	}
	if rec := operationDone(t, ctx, ops, hosted.ClientID, created.OperationID); rec.Kind != schema.OpCreateConversation || len(rec.MessageIDs) != 2 {
		t.Fatalf("create record %+v", rec)
	}

	var apiErr *client.APIError
	if _, err := client.NewOperations(f.URL, allinone.DevTenant, events, nil).SendText(ctx, hosted.ClientID, created.GroupID, "send-2", "x"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusForbidden {
		t.Fatalf("an events token sends: %v", err)
	}
	if _, err := ops.SendText(ctx, hosted.ClientID, created.GroupID, "", "x"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest {
		t.Fatalf("a send without Idempotency-Key: %v", err)
	}
	if _, err := ops.SendText(ctx, strings.Repeat("ab", 32), created.GroupID, "send-4", "x"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
		t.Fatalf("a send as a client the tenant does not host: %v", err)
	}
	if _, err := ops.AddMembers(ctx, hosted.ClientID, created.GroupID, "add-1", []byte{0, 1, 0, 5}); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest {
		t.Fatalf("an add of a KeyPackage that does not parse: %v", err)
	}
	// admin implies send.
	if _, err := client.NewOperations(f.URL, allinone.DevTenant, admin, nil).SendText(ctx, hosted.ClientID, created.GroupID, "send-3", "by admin"); err != nil {
		t.Fatalf("an admin token sends: %v", err)
	}
	next(t, sub, schema.KindMessageStatusChanged)
}

// operationDone waits for an operation's record to say done.
func operationDone(t testing.TB, ctx context.Context, ops *client.Operations, clientID string, id []byte) schema.Operation {
	t.Helper()
	rec := operationFinal(t, ctx, ops, clientID, id)
	if rec.Status != schema.OperationDone {
		t.Fatalf("operation %+v, want done", rec)
	}
	return rec
}

func ok[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// inProcess lets one test at a time run all-in-ones in this process: they
// run under -race in the test binary and take the CPU, so several at once
// on two cores starve each other past their timeouts, while the tests of
// processes beside them mostly wait.
var inProcess = make(chan struct{}, 1)

// oneInProcess waits for the in-process slot and holds it until t and its
// cleanups (the fabrics' shutdowns) end; call it before starting a clock.
func oneInProcess(t testing.TB) {
	t.Helper()
	inProcess <- struct{}{}
	t.Cleanup(func() { <-inProcess })
}

// startInProcess starts the all-in-one in this process on free loopback
// ports, its options changed by opts, and shuts it down when the test ends.
func startInProcess(t testing.TB, ctx context.Context, opts ...func(*allinone.Options)) *allinone.Fabric {
	t.Helper()
	o := allinone.Options{DataDir: t.TempDir(), Listen: freeAddr(t), NATSListen: "127.0.0.1:0"}
	for _, opt := range opts {
		opt(&o)
	}
	f, err := allinone.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		if err := f.Shutdown(sctx); err != nil {
			t.Error(err)
		}
	})
	waitReady(t, f.URL+"/readyz", 30*time.Second)
	return f
}
