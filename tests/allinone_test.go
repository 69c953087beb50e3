package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// allInOne starts `fabric run` as a process and returns its API and tokens.
type allInOne struct {
	proc                                *process
	data                                string // its data directory
	url, natsURL                        string
	admin, ingest, events, signalsToken string
}

func startAllInOne(t *testing.T) *allInOne {
	t.Helper()
	data := t.TempDir()
	p := start(t, filepath.Join(binaries(t), "fabric"), nil,
		"run", "-data", data, "-listen", freeAddr(t), "-nats-listen", "127.0.0.1:0")
	f := &allInOne{proc: p, data: data}
	f.url = p.waitLine(t, "HTTP API", time.Minute)
	f.natsURL = p.waitLine(t, "NATS", 5*time.Second)
	f.admin = p.waitLine(t, "admin", 5*time.Second)
	f.ingest = p.waitLine(t, "ingest", 5*time.Second)
	f.events = p.waitLine(t, "events", 5*time.Second)
	f.signalsToken = p.waitLine(t, "signals", 5*time.Second)
	waitReady(t, f.url+"/readyz", 30*time.Second)
	return f
}

// wsURL is the gateway's events WebSocket.
func (f *allInOne) wsURL() string { return "ws" + strings.TrimPrefix(f.url, "http") + "/v1/events" }

// hostAndConnect registers a hosted client for a new inbox over HTTP and
// connects the SDK to the events WebSocket; the test's end closes it.
func (f *allInOne) hostAndConnect(t *testing.T, ctx context.Context) (*demo.API, demo.Registered, *client.Client) {
	t.Helper()
	api := &demo.API{BaseURL: f.url, Tenant: "dev", AdminToken: f.admin, IngestToken: f.ingest}
	account := make([]byte, 32)
	rand.Read(account)
	hosted, err := api.Register(ctx, hex.EncodeToString(account))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Connect(ctx, f.wsURL(), f.events)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return api, hosted, c
}

// next reads the subscription's next event of kind, failing on any other.
func next(t *testing.T, sub *client.Subscription, kind schema.EventKind) schema.ClientEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ev, err := sub.Next(ctx)
	if err != nil {
		t.Fatalf("waiting for %s: %v", kind, err)
	}
	if ev.Kind != kind {
		t.Fatalf("got %s, want %s: %+v", ev.Kind, kind, ev)
	}
	return ev
}

// TestAllInOneWholePath runs the all-in-one binary as a process, registers a
// hosted client over HTTP, plays remote members' traffic into the transport
// endpoint and reads the hosted client's events over a WebSocket.
func TestAllInOneWholePath(t *testing.T) {
	t.Parallel()
	f := startAllInOne(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	api, hosted, c := f.hostAndConnect(t, ctx)
	sub, err := c.Subscribe(ctx, hosted.ClientID, schema.EventFilter{Kinds: schema.AllKinds()})
	if err != nil {
		t.Fatal(err)
	}

	alice, _ := testpeer.New("alice")
	bob, _ := testpeer.New("bob")
	a, err := alice.CreateGroup(components.Set{
		Profile: &components.ProfileState{Name: "e2e"},
		Admins:  []components.AccountID{alice.AccountID()},
	})
	if err != nil {
		t.Fatal(err)
	}
	addBob, joined, err := a.Add(bob)
	if err != nil {
		t.Fatal(err)
	}
	b := joined[0]
	invite, welcome, err := a.Invite(hosted.KeyPackages[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Process(invite.Transport); err != nil {
		t.Fatal(err)
	}
	post := func(m testpeer.Message, want string) {
		t.Helper()
		res, err := api.Post(ctx, m.Transport)
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Status != want || !bytes.Equal(res[0].MessageID, m.ID) {
			t.Fatalf("intake answered %+v, want %s for message %x", res[0], want, m.ID)
		}
	}
	post(addBob, "rejected") // unknown_group: no hosted client holds the group yet
	post(invite, "rejected")
	post(welcome, "queued")

	j := next(t, sub, schema.KindConversationJoined).ConversationJoined
	if !bytes.Equal(j.GroupID, a.ID()) || j.ConversationType != schema.ConversationGroup ||
		j.Origin != schema.OriginWelcomed || j.AdderInboxID == nil || *j.AdderInboxID != alice.InboxID() {
		t.Fatalf("conversation.joined = %+v", j)
	}

	hi, err := b.SendText("hello")
	if err != nil {
		t.Fatal(err)
	}
	post(hi, "queued")
	r := next(t, sub, schema.KindMessageReceived).MessageReceived
	if !bytes.Equal(r.GroupID, a.ID()) || !bytes.Equal(r.MessageID, hi.ID) || r.SenderInboxID != bob.InboxID() ||
		r.ContentType == nil || r.ContentType.AuthorityID != "xmtp.org" || r.ContentType.TypeID != "text" {
		t.Fatalf("message.received = %+v", r)
	}

	rename, err := a.SetComponents(components.Set{
		Profile: &components.ProfileState{Name: "e2e renamed"},
		Admins:  []components.AccountID{alice.AccountID()},
	})
	if err != nil {
		t.Fatal(err)
	}
	post(rename, "queued")
	m := next(t, sub, schema.KindMetadataChanged).MetadataChanged
	if !bytes.Equal(m.GroupID, a.ID()) || !slices.Equal(m.Changed, []string{"group_name"}) {
		t.Fatalf("metadata_changed = %+v", m)
	}

	t.Run("promtool check metrics", func(t *testing.T) {
		promtool(t, httpGet(t, f.url+"/metrics"), "check", "metrics")
	})
}
