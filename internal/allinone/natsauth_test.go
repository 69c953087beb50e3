package allinone

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
)

// natsAs connects to the fabric's NATS as user with the password the data
// directory holds, collecting the asynchronous errors the server sends.
func natsAs(t *testing.T, f *Fabric, user string) (*nats.Conn, chan error) {
	t.Helper()
	pw, err := os.ReadFile(NATSPasswordFile(f.opts.DataDir, user))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 16)
	nc, err := nats.Connect(f.NATSURL, nats.UserInfo(user, strings.TrimSpace(string(pw))),
		nats.CustomInboxPrefix(InboxPrefix(user)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc, errs
}

// refused reports whether the server refused what act did with a
// permissions violation.
func refused(t *testing.T, nc *nats.Conn, errs chan error, act func() error) bool {
	t.Helper()
	// A refused request times out; the violation arrives apart.
	if err := act(); errors.Is(err, nats.ErrPermissionViolation) {
		return true
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		return errors.Is(err, nats.ErrPermissionViolation)
	case <-time.After(time.Second):
		return false
	}
}

// drain takes the asynchronous errors of what was done before, so that
// refused reads only its own.
func drain(t *testing.T, nc *nats.Conn, errs chan error) {
	t.Helper()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case <-errs:
		default:
			return
		}
	}
}

// The all-in-one's NATS refuses a client without credentials, and each
// role's user what its role does not do: reading another role's subjects
// and replies, deleting a stream, publishing input or events it does not
// make.
func TestNATSRolesAreLeastPrivilege(t *testing.T) {
	t.Parallel()
	f := startFabric(t, Options{})
	if nc, err := nats.Connect(f.NATSURL); err == nil {
		nc.Close()
		t.Fatal("a client without credentials connected")
	}
	if nc, err := nats.Connect(f.NATSURL, nats.UserInfo(UserFanout, "guess")); err == nil {
		nc.Close()
		t.Fatal("a wrong password connected")
	}
	const event, input = "fabric.ev.dev.c0ffee", "fabric.in.dev.00ff.0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const outbound, opRecord = "fabric.out.dev.00ff", "fabric.op.dev.0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	may := map[string][]string{ // subject -> the users that may publish it
		event: {UserAPI, UserConverge},
		// The client API stores operations as input (issue 19).
		input: {UserIngest, UserAPI},
		// Only converge sends, in its fenced batches.
		outbound: {UserConverge},
		opRecord: {UserAPI, UserConverge},
	}
	reads := map[string][]string{ // subject -> the users that may subscribe to it
		"fabric.live.dev.c0ffee": {UserFanout},
		"fabric.intake.dev":      {UserIngest},
		// Operation requests are the client API's (issue 19).
		"fabric.operate.dev.c0ffee.send_message": {UserAPI},
		"fabric.ev.dev.c0ffee":                   {},
		"fabric.in.>":                            {},
		"$KV.fabric-clients.>":                   {},
		"$JS.API.>":                              {},
		"_INBOX.>":                               {},
		InboxPrefix(UserAPI) + ".>":              {UserAPI},
	}
	for _, user := range NATSUsers {
		t.Run(user, func(t *testing.T) {
			nc, errs := natsAs(t, f, user)
			if !refused(t, nc, errs, func() error {
				_, err := nc.Request("$JS.API.STREAM.DELETE.FABRIC_IN", nil, 200*time.Millisecond)
				return err
			}) {
				t.Error("may delete a stream")
			}
			if !refused(t, nc, errs, func() error {
				_, err := nc.Request("$JS.API.STREAM.PURGE.FABRIC_IN", nil, 200*time.Millisecond)
				return err
			}) {
				t.Error("may purge the input stream")
			}
			for subj, users := range may {
				if slices.Contains(users, user) {
					continue
				}
				if !refused(t, nc, errs, func() error { return nc.Publish(subj, []byte("forged")) }) {
					t.Errorf("may publish %s", subj)
				}
			}
			for subj, users := range reads {
				if slices.Contains(users, user) {
					continue
				}
				if !refused(t, nc, errs, func() error { _, err := nc.SubscribeSync(subj); return err }) {
					t.Errorf("may subscribe to %s", subj)
				}
			}
		})
	}
	if _, err := f.nc.Request("$JS.API.STREAM.INFO.FABRIC_IN", nil, 5*time.Second); err != nil {
		t.Fatalf("FABRIC_IN after the attempts: %v", err)
	}
}

// Issue 27, item 1: the attacks each role's user made on b1551bc, made
// again with the same credentials against the all-in-one's server. Each
// must fail: refused by the server's permissions, or by JetStream itself
// where the permission is the stream's own name (a stream that exists is
// not made again).
func TestNATSRolesAreLeastPrivilegeAgainstTheProbedAttacks(t *testing.T) {
	t.Parallel()
	f := startFabric(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	short := func(act func(context.Context) error) func() error {
		return func() error {
			actx, acancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer acancel()
			return act(actx)
		}
	}
	// Each user probes on its own connection, at once: a refused request
	// waits out its timeout, which is most of this test's time.
	t.Run("users", func(t *testing.T) {
		for _, user := range NATSUsers {
			t.Run(user, func(t *testing.T) {
				t.Parallel()
				nc, errs := natsAs(t, f, user)
				js, err := jetstream.New(nc)
				if err != nil {
					t.Fatal(err)
				}
				// converge purged every tenant's events.
				for _, s := range []string{streams.StreamEvents, streams.StreamInput, streams.StreamOutcomes, streams.StreamRetained, streams.KVStream(streams.BucketConverge)} {
					if !refused(t, nc, errs, func() error {
						_, err := nc.Request(bus.PermStreamPurge+s, []byte(`{"filter":">"}`), 300*time.Millisecond)
						return err
					}) {
						t.Errorf("may purge %s", s)
					}
				}
				// ingest (and the deploy's api) re-made ingest-outbound with a
				// filter on the events and read them.
				for _, cfg := range []jetstream.ConsumerConfig{
					{Durable: streams.ConsumerOutbound, FilterSubject: "fabric.ev.*.*", AckPolicy: jetstream.AckExplicitPolicy},
					{Durable: streams.ConsumerOutbound, FilterSubject: "fabric.op.*.*", AckPolicy: jetstream.AckExplicitPolicy},
					{Durable: "spy", FilterSubject: "fabric.ev.*.*", AckPolicy: jetstream.AckExplicitPolicy},
				} {
					if !refused(t, nc, errs, short(func(ctx context.Context) error {
						_, err := js.CreateOrUpdateConsumer(ctx, streams.StreamEvents, cfg)
						return err
					})) {
						t.Errorf("may make consumer %s on %s", cfg.Durable, cfg.FilterSubject)
					}
				}
				// admin made a mirror of the events republishing onto its own
				// inbox.
				for _, cfg := range []jetstream.StreamConfig{
					{Name: "SPY", Mirror: &jetstream.StreamSource{Name: streams.StreamEvents}, RePublish: &jetstream.RePublish{Source: ">", Destination: InboxPrefix(user) + ".spy.>"}},
					{Name: "SPY", Sources: []*jetstream.StreamSource{{Name: streams.StreamEvents}}, RePublish: &jetstream.RePublish{Source: ">", Destination: InboxPrefix(user) + ".spy.>"}},
					{Name: "SPY", Subjects: []string{"fabric.intake.*"}},
				} {
					if !refused(t, nc, errs, short(func(ctx context.Context) error {
						_, err := js.CreateStream(ctx, cfg)
						return err
					})) {
						t.Errorf("may make stream %s", cfg.Name)
					}
				}
				// The fabric's own stream names: refused, or refused by
				// JetStream as made already.
				spy := jetstream.StreamConfig{Name: streams.StreamEvents, Subjects: []string{"fabric.ev.*.*"}, RePublish: &jetstream.RePublish{Source: ">", Destination: InboxPrefix(user) + ".spy.>"}}
				if err := short(func(ctx context.Context) error { _, err := js.CreateStream(ctx, spy); return err })(); err == nil {
					t.Errorf("made %s again republishing onto its inbox", streams.StreamEvents)
				}
				drain(t, nc, errs)
				// bridge made a push consumer delivering outbound messages onto
				// a client's live subject. ingest makes the bridges'
				// consumers of outbound subjects (bridge.Provisioner), which it
				// reads whole anyway; NATS cannot tell it a push from a pull
				// consumer, so it is the one user that could.
				if user == UserIngest {
					return
				}
				push := jetstream.ConsumerConfig{Durable: "to-b", FilterSubject: "fabric.out.dev.*", DeliverSubject: "fabric.live.dev.c0ffee", AckPolicy: jetstream.AckNonePolicy}
				if !refused(t, nc, errs, short(func(ctx context.Context) error {
					_, err := js.CreateOrUpdateConsumer(ctx, streams.StreamEvents, push)
					return err
				})) {
					t.Error("may make a push consumer onto fabric.live")
				}
			})
		}
	})
	info, err := f.nc.Request(bus.PermStreamInfo+streams.StreamEvents, nil, 5*time.Second)
	if err != nil || !strings.Contains(string(info.Data), `"config"`) {
		t.Fatalf("FABRIC_EVENTS after the attacks: %v %s", err, info.Data)
	}
}
