package allinone

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

var updateDeploy = flag.Bool("update-deploy", false, "write deploy/nats/accounts.conf (and the Helm chart's copy) from rolePermissions")

// deployAccountsFiles are where the deploy's NATS users live: the nodes
// include the first, the Helm chart ships the second.
var deployAccountsFiles = []string{"../../deploy/nats/accounts.conf", "../../deploy/helm/fabric/files/accounts.conf"}

// deployUsers are the deploy's NATS users and what each is for. The
// deploy's api workload is ingest with the client API (ingest
// -nats-intake=false), so its user holds ingest's publish permissions
// beside the client API's; every other user is the all-in-one's.
var deployUsers = []struct{ name, doc string }{
	{UserIngest, "ingest takes transport input: it publishes input, outcome records and\nretained objects, reads them back, deletes a released retained object, and\nwatches group keys and hosted groups. It takes what hosted clients send\n(fabric.out.>) through its one consumer on FABRIC_EVENTS as input, and makes\nthe consumers bridges ask for on fabric.bridge.<tenant>.<name>, each of one\ntenant's outbound subjects; it never reads events, client records or\nconverge state. Every consumer it makes names its filter in the create\nsubject. Intake and bridge requests are answered on the requester's inbox."},
	{UserConverge, "converge reads input through its partition consumers, writes events and\ncheckpoints (pruning superseded checkpoints), outcome records, its own\nstate, group keys and group records, and reads hosted client records and\nretires the KeyPackages a Welcome used in them. It stores what hosted\nclients send (fabric.out.>) and operation records (fabric.op.>) in its\nfenced batches. Its 64 partition consumers are named one by one, each with\nits filter; it purges nothing (a checkpoint rolls up the ones before it)."},
	{UserFanout, "fanout only reads events: the republished live subjects, direct gets for\ngap repair, the group records for stitched DMs, and whether a client exists."},
	{UserAPI, "api is ingest with the client API (ingest -nats-intake=false): what ingest\npublishes, and the client stores and signals, which write hosted client\nrecords (private keys sealed) and store state and publish the events those\nstores emit, the read API, which reads hosted clients' state, and\noperations, asked over HTTP or as NATS requests on fabric.operate.> (answered\non the requester's inbox): stored as input, their first record on fabric.op.>."},
	{UserAdmin, "admin provisions (fabric provision): it creates the fabric's streams and\nbuckets, each by its name (no other stream: no mirror, source or republish\nonto what it reads), and reads their configuration; it reads and changes no\nmessage."},
}

// deployPermissions are the deploy's users' permissions, from
// rolePermissions.
func deployPermissions() map[string]*server.Permissions {
	perms := rolePermissions()
	api := *perms[UserAPI]
	pub := slices.Clone(api.Publish.Allow)
	for _, s := range perms[UserIngest].Publish.Allow {
		if !slices.Contains(pub, s) {
			pub = append(pub, s)
		}
	}
	api.Publish = &server.SubjectPermission{Allow: pub}
	perms[UserAPI] = &api
	// A bridge is per tenant and per destination: docs/outbound.md gives
	// its user; the deploy runs none.
	delete(perms, UserBridge)
	return perms
}

// deployAccounts renders the deploy's accounts.conf.
func deployAccounts() []byte {
	var b bytes.Buffer
	b.WriteString(`# Generated from internal/allinone (rolePermissions), the one definition of
# what each role may do, by
#   go test ./internal/allinone -run TestDeployAccountsAreTheRolePermissions -update-deploy
# Do not edit by hand; the test fails when this file and the code differ.
#
# One account for the fabric, one user per role, each allowed only what its
# role does. Passwords come from the environment of the nats-server process.
# Every user receives its replies under its own inbox prefix, _INBOX_<user>
# (the roles' default with -nats-user). JetStream API calls are publishes to
# $JS.API.<call>.<stream>...; a bucket is the stream KV_<bucket>.
# tests/deployrun_test.go runs every role under its user on a cluster made
# from these files and shows each refused what it must not do.
accounts {
  FABRIC {
    jetstream: enabled
    users: [
`)
	perms := deployPermissions()
	list := func(subjects []string) string {
		q := make([]string, len(subjects))
		for i, s := range subjects {
			q[i] = fmt.Sprintf("%q", s)
		}
		return "[\n            " + strings.Join(q, ",\n            ") + "\n          ]"
	}
	for _, u := range deployUsers {
		p := perms[u.name]
		for line := range strings.SplitSeq(u.doc, "\n") {
			b.WriteString("      # " + line + "\n")
		}
		fmt.Fprintf(&b, "      {\n        user: %s\n        password: $FABRIC_%s_PASSWORD\n        permissions: {\n", u.name, strings.ToUpper(u.name))
		fmt.Fprintf(&b, "          publish: { allow: %s }\n", list(p.Publish.Allow))
		fmt.Fprintf(&b, "          subscribe: { allow: %s }\n", list(p.Subscribe.Allow))
		if r := p.Response; r != nil {
			fmt.Fprintf(&b, "          allow_responses: { max: %d, expires: %q }\n", r.MaxMsgs, r.Expires.String())
		}
		b.WriteString("        }\n      }\n")
	}
	b.WriteString(`    ]
  }
  SYS { users: [ { user: sys, password: $FABRIC_SYS_PASSWORD } ] }
}
system_account: SYS
`)
	return b.Bytes()
}

// TestDeployAccountsAreTheRolePermissions keeps deploy/nats/accounts.conf
// the all-in-one's role permissions: generated from them, and loaded by
// nats-server to the same permissions.
func TestDeployAccountsAreTheRolePermissions(t *testing.T) {
	want := deployAccounts()
	if *updateDeploy {
		for _, f := range deployAccountsFiles {
			if err := os.WriteFile(f, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range deployAccountsFiles {
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not generated from rolePermissions; run go test ./internal/allinone -run %s -update-deploy", f, t.Name())
		}
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), want, 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte("include ./accounts.conf\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, u := range append(NATSUsers, "sys") {
		t.Setenv("FABRIC_"+strings.ToUpper(u)+"_PASSWORD", "secret-"+u)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	perms := deployPermissions()
	for _, u := range opts.Users {
		want, ok := perms[u.Username]
		if u.Username == "sys" {
			continue
		}
		if !ok {
			t.Errorf("accounts.conf has user %s, which rolePermissions does not know", u.Username)
			continue
		}
		delete(perms, u.Username)
		got := u.Permissions
		if !slices.Equal(got.Publish.Allow, want.Publish.Allow) || !slices.Equal(got.Subscribe.Allow, want.Subscribe.Allow) ||
			(got.Response == nil) != (want.Response == nil) ||
			got.Response != nil && (got.Response.MaxMsgs != want.Response.MaxMsgs || got.Response.Expires != want.Response.Expires) {
			t.Errorf("user %s loads as %+v %+v %+v, want %+v %+v %+v", u.Username,
				got.Publish, got.Subscribe, got.Response, want.Publish, want.Subscribe, want.Response)
		}
	}
	for u := range perms {
		t.Errorf("accounts.conf has no user %s", u)
	}
}
