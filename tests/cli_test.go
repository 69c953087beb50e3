package tests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// The command line follows the usual conventions: `fabric -h` and
// `fabric help` list every subcommand with one line each, `fabric <cmd> -h`
// and `fabric help <cmd>` show that command's flags, and a bad flag,
// command or argument is reported once, with the usage, and exit status 2.
func TestCommandLineHelpAndErrorsFollowConventions(t *testing.T) {
	t.Parallel()
	bin := binaries(t)
	fabric := filepath.Join(bin, "fabric")
	for _, args := range [][]string{{"-h"}, {"help"}, {"--help"}} {
		out, code := runToExit(t, fabric, nil, args...)
		if code != 0 {
			t.Errorf("fabric %s: exit status %d", strings.Join(args, " "), code)
		}
		for _, cmd := range []string{"run", "provision", "demo", "tail", "load", "bridge", "token", "help"} {
			if !strings.Contains(out, "\n  "+cmd+" ") {
				t.Errorf("fabric %s does not list %s on a line of its own:\n%s", strings.Join(args, " "), cmd, out)
			}
		}
	}
	for _, args := range [][]string{{"tail", "-h"}, {"help", "tail"}, {"run", "-h"}, {"help", "run"}, {"bridge", "-h"}} {
		out, code := runToExit(t, fabric, nil, args...)
		flags := map[string]string{"tail": "-client", "run": "-nats-listen", "bridge": "-to"}
		want := flags[args[len(args)-1]]
		if args[1] == "-h" {
			want = flags[args[0]]
		}
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("fabric %s: exit status %d, want 0 and the flag %s:\n%s", strings.Join(args, " "), code, want, out)
		}
	}
	for _, c := range []struct {
		bin  string
		args []string
		once string
	}{
		{"fabric", []string{"run", "-bogus"}, "-bogus"},
		{"fabric", []string{"tail", "-bogus"}, "-bogus"},
		{"fabric", []string{"bogus"}, `"bogus"`},
		{"fabric", []string{"tail", "stray"}, `"stray"`},
		{"fabric", []string{"bridge", "-bogus"}, "-bogus"},
		{"ingest", []string{"-bogus"}, "-bogus"},
		{"converge", []string{"-bogus"}, "-bogus"},
		{"fanout", []string{"-bogus"}, "-bogus"},
	} {
		out, code := runToExit(t, filepath.Join(bin, c.bin), nil, c.args...)
		if code != 2 || strings.Count(out, c.once) != 1 || !strings.Contains(out, "sage") {
			t.Errorf("%s %s: exit status %d, want 2 with the error once and the usage:\n%s", c.bin, strings.Join(c.args, " "), code, out)
		}
	}
}

// `fabric tail -from-start`, run as a process after an event was stored,
// prints that event: it starts from the stream, not live. -since and
// -from-start together are an invalid configuration, said clearly.
func TestTailFromStartPrintsStoredEvents(t *testing.T) {
	t.Parallel()
	f := startAllInOne(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api, hosted, c := f.hostAndConnect(t, ctx)
	wsURL := f.wsURL()
	sub, err := c.Subscribe(ctx, hosted.ClientID, schema.EventFilter{Kinds: schema.AllKinds()})
	if err != nil {
		t.Fatal(err)
	}
	alice, _ := testpeer.New("alice")
	a, err := alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}})
	if err != nil {
		t.Fatal(err)
	}
	_, welcome, err := a.Invite(hosted.KeyPackages[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Post(ctx, welcome.Transport); err != nil {
		t.Fatal(err)
	}
	next(t, sub, schema.KindConversationJoined) // stored before tail starts

	env := []string{"FABRIC_EVENTS_TOKEN=" + f.events}
	bin := filepath.Join(binaries(t), "fabric")
	out, code := runToExit(t, bin, env, "tail", "-url", wsURL, "-client", hosted.ClientID, "-since", "10m", "-from-start")
	if code != 1 || !strings.Contains(out, "-since and -from-start exclude each other") {
		t.Errorf("-since with -from-start: exit status %d, want 1 (invalid configuration) with a clear error:\n%s", code, out)
	}
	p := start(t, bin, env, "tail", "-url", wsURL, "-client", hosted.ClientID, "-from-start")
	p.waitMatch(t, string(schema.KindConversationJoined), 30*time.Second, func(l string) (string, bool) {
		return l, strings.Contains(l, string(schema.KindConversationJoined))
	})
}

// Issue 27, item 5: `fabric provision -tenant dev -from-data` makes the
// tenant's NATS user on a running all-in-one: it asks dev's intake with
// dev's ingest token and gets the answer on its own inbox, and may not ask
// another tenant's. Without -from-data it prints the user for a
// deployment's accounts.conf, the password only as a bcrypt hash.
func TestProvisionTenantMakesItsNATSUser(t *testing.T) {
	t.Parallel()
	f := startAllInOne(t)
	bin := filepath.Join(binaries(t), "fabric")
	out, code := runToExit(t, bin, nil, "provision", "-tenant", "dev", "-from-data", f.data)
	if code != 0 || !strings.Contains(out, "tenant-dev") {
		t.Fatalf("provision -tenant dev -from-data: exit %d:\n%s", code, out)
	}
	pw, err := os.ReadFile(filepath.Join(f.data, "nats-tenant-dev-password"))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	var nc *nats.Conn
	eventually.NoErrorWithin(t, time.Minute, func() error {
		nc, err = nats.Connect(f.natsURL, nats.UserInfo("tenant-dev", strings.TrimSpace(string(pw))), nats.CustomInboxPrefix("_INBOX_tenant-dev"),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
		return err
	})
	defer nc.Close()
	req := nats.NewMsg("fabric.intake.dev")
	req.Header.Set("Authorization", "Bearer "+f.ingest)
	req.Data = []byte(`{"messages":[]}`)
	if reply, err := nc.RequestMsg(req, 10*time.Second); err != nil || reply.Header.Get("Fabric-Status") == "" {
		t.Fatalf("tenant-dev asks dev's intake: %v", err)
	}
	if err := nc.Publish("fabric.intake.other", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("tenant-dev publishing another tenant's intake: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("tenant-dev may publish another tenant's intake")
	}

	out, code = runToExit(t, bin, nil, "provision", "-tenant", "acme")
	if code != 0 || !strings.Contains(out, `user: tenant-acme, password: "$2a$`) || !strings.Contains(out, `"fabric.intake.acme"`) {
		t.Fatalf("provision -tenant acme: exit %d:\n%s", code, out)
	}
}
