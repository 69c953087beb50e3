package allinone

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/ingest"
)

// Issue 27, item 5: a tenant's user on the all-in-one. fabric provision
// -tenant acme -from-data makes its password; the running all-in-one
// takes it within seconds. It may ask acme's intake and acme's operations
// (answered on its own inbox) and nothing else: no other tenant's
// subjects, no stream, no other user's replies.
func TestTenantNATSUserReachesOnlyItsOwnIntake(t *testing.T) {
	f := startFabric(t, Options{})
	const tenant = "acme"
	pw, err := ProvisionTenantUser(f.DataDir(), tenant)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := ProvisionTenantUser(f.DataDir(), tenant); err != nil || again != pw {
		t.Fatalf("provisioned again: a new password (%v)", err)
	}
	user := TenantUser(tenant)
	errs := make(chan error, 16)
	var nc *nats.Conn
	eventually.NoErrorWithin(t, time.Minute, func() error {
		nc, err = nats.Connect(f.NATSURL, nats.UserInfo(user, pw), nats.CustomInboxPrefix(InboxPrefix(user)),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
		return err
	})
	t.Cleanup(nc.Close)

	tok, err := auth.Mint(f.secret, auth.Claims{Tenant: tenant, Scopes: []auth.Scope{auth.ScopeIngest}, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	req := nats.NewMsg("fabric.intake." + tenant)
	req.Header.Set(ingest.HeaderAuthorization, "Bearer "+tok)
	req.Data = []byte(`{"messages":[]}`)
	reply, err := nc.RequestMsg(req, 10*time.Second)
	if err != nil {
		t.Fatalf("acme's user asks acme's intake: %v", err)
	}
	if reply.Header.Get(ingest.HeaderStatus) == "" {
		t.Fatalf("acme's intake answered without a status: %q", reply.Data)
	}
	op, err := nc.Request("fabric.operate."+tenant+".abab.send_message", []byte(`{}`), 10*time.Second)
	if err != nil || op.Header.Get(ingest.HeaderStatus) == "" {
		t.Fatalf("acme's user asks an operation: %v, want an answer", err)
	}

	for _, subj := range []string{"fabric.intake.dev", "fabric.operate.dev.abab.send_message", "fabric.in.acme.00ff.00",
		"fabric.ev.acme.abab", "$KV.fabric-clients.acme.abab", "$JS.API.STREAM.INFO.FABRIC_IN", "$JS.API.DIRECT.GET.FABRIC_EVENTS"} {
		if !refused(t, nc, errs, func() error { return nc.Publish(subj, []byte("{}")) }) {
			t.Errorf("acme's user may publish %s", subj)
		}
	}
	for _, subj := range []string{"fabric.intake.acme", "fabric.live.acme.abab", "_INBOX.>", InboxPrefix(UserIngest) + ".>", InboxPrefix("tenant-dev") + ".>", ">"} {
		if !refused(t, nc, errs, func() error { _, err := nc.SubscribeSync(subj); return err }) {
			t.Errorf("acme's user may subscribe to %s", subj)
		}
	}
}

// A tenant's user for a NATS server's configuration (the deploy): its
// permissions as the all-in-one gives them, its password only as a bcrypt
// hash, and the block loads.
func TestTenantUserConfLoads(t *testing.T) {
	t.Parallel()
	conf, err := TenantUserConf("acme", "s3cret-password")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(conf, "s3cret") {
		t.Fatal("the configuration holds the password in the clear")
	}
	dir := t.TempDir()
	path := dir + "/nats.conf"
	if err := os.WriteFile(path, []byte("accounts { FABRIC { users: [\n"+conf+"\n] } }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("%v\n%s", err, conf)
	}
	want, err := TenantPermissions("acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(opts.Users) != 1 || opts.Users[0].Username != "tenant-acme" ||
		strings.Join(opts.Users[0].Permissions.Publish.Allow, " ") != strings.Join(want.Publish.Allow, " ") ||
		strings.Join(opts.Users[0].Permissions.Subscribe.Allow, " ") != strings.Join(want.Subscribe.Allow, " ") {
		t.Fatalf("loads as %+v, want %+v %+v", opts.Users, want.Publish, want.Subscribe)
	}
	if _, err := TenantUserConf("Acme.*", "x"); err == nil {
		t.Fatal("a tenant id that is not one was accepted")
	}
}
