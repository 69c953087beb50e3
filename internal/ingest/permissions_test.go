package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// The NATS intake auth model (docs/ingest.md): a tenant's gateway user may
// publish only to its own intake subject, so it cannot submit input for
// another tenant, while the workers' user takes every tenant's requests.
func TestNATSPermissionsConfineGatewayToItsTenant(t *testing.T) {
	t.Parallel()
	opts := &server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(),
		Users: []*server.User{
			{Username: "ingest", Password: "ingest-pass"},
			{Username: "acme-gateway", Password: "acme-pass", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{intakeSubject(testTenant)}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}},
		},
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	url := ns.ClientURL()
	nc, err := nats.Connect(url, nats.UserInfo("ingest", "ingest-pass"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Config{}); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, nc: nc, js: js, connect: func() (*nats.Conn, error) {
		return nats.Connect(url, nats.UserInfo("ingest", "ingest-pass"))
	}}
	e.addWorkers(envOpts{})

	violations := make(chan error, 4)
	gw, err := nats.Connect(url, nats.UserInfo("acme-gateway", "acme-pass"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	g := newGroup(t)
	body, _ := json.Marshal(wire{V: 1, Group: g.ID(), Kind: "mls", Payload: []byte{1, 2, 3}})

	reply, err := gw.Request(intakeSubject(testTenant), body, 5*time.Second)
	if err != nil {
		t.Fatalf("own tenant: %v", err)
	}
	var r Response
	if err := json.Unmarshal(reply.Data, &r); err != nil || len(r.Results) != 1 || r.Results[0].Category != schema.CategoryInvalidEncoding {
		t.Fatalf("own tenant reply: %s", reply.Data)
	}

	if _, err := gw.Request(intakeSubject("other"), body, 300*time.Millisecond); err == nil {
		t.Fatal("a request for another tenant was answered")
	}
	select {
	case err := <-violations:
		if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("async error %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no permissions violation reported")
	}
	// Nothing was recorded for the other tenant.
	if _, ok := e.workers[0].outcomeOf(t, "other", r.Results[0].MessageID); ok {
		t.Fatal("an outcome was recorded for the other tenant")
	}
}
