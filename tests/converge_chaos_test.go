package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

var convergeChaos = flag.Bool("converge-chaos", false, "run the long converge chaos test: ~1000 inputs, many kill -9s")

// chaosGroup is one group of the chaos run: its hosted members and the
// application messages sent, in order.
type chaosGroup struct {
	id      []byte
	members []string
	sent    [][]byte
}

// TestConvergeChaos runs cmd/converge as real processes, kills them with
// SIGKILL at random points while input for many groups arrives, restarts
// them, and lets a second worker take over a dead one's partitions. Every
// hosted client must end with exactly its events: none lost, none
// duplicated, each group's messages in the order sent (EVENT-001,
// EVENT-012).
func TestConvergeChaos(t *testing.T) {
	t.Parallel()
	groups, members, perGroup, kills, pace := 4, 2, 25, 2, 40*time.Millisecond
	if *convergeChaos {
		groups, members, perGroup, kills, pace = 20, 3, 50, 8, 12*time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := filepath.Join(binaries(t), "converge")

	n := natstest.Start(t, natstest.OverLoopback())
	srv, js := n.Server, n.JS
	key := sha256.Sum256([]byte("chaos master key"))
	vault, err := engine.NewVault(key[:])
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := auth.NewVerifier([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	store, err := clientstore.New(ctx, clientstore.Config{JS: js, Vault: vault, Verifier: verifier, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}

	// Prepare every input before any process runs: peers are not safe for
	// concurrent use, and the publisher then only sends bytes.
	const tenant = "chaos"
	var inputs []testpeer.Message
	var cgs []*chaosGroup
	for gi := range groups {
		alice, err := testpeer.New(fmt.Sprintf("alice-%d", gi))
		if err != nil {
			t.Fatal(err)
		}
		cg := &chaosGroup{}
		var kps [][]byte
		for mi := range members {
			acct := sha256.Sum256(fmt.Appendf(nil, "member-%d-%d", gi, mi))
			one := 1
			rec, kp, err := store.RegisterClient(ctx, tenant, clientstore.RegisterRequest{InboxID: hex.EncodeToString(acct[:]), KeyPackages: &one})
			if err != nil {
				t.Fatal(err)
			}
			cg.members = append(cg.members, rec.ClientID)
			kps = append(kps, kp[0])
		}
		g, err := alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}})
		if err != nil {
			t.Fatal(err)
		}
		cg.id = g.ID()
		_, welcome, err := g.Invite(kps...)
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, welcome)
		for i := range perGroup {
			m, err := g.SendText(fmt.Sprintf("message %d", i))
			if err != nil {
				t.Fatal(err)
			}
			cg.sent = append(cg.sent, m.ID)
			inputs = append(inputs, m)
		}
		cgs = append(cgs, cg)
	}
	// Interleave groups, keeping each group's order.
	order := interleave(inputs, groups, perGroup+1)

	env := []string{"FABRIC_NATS_URL=" + srv.ClientURL(), "FABRIC_MASTER_KEY=" + hex.EncodeToString(key[:])}
	run := func(id string) *process {
		return start(t, bin, env, "-worker-id", id, "-listen", freeAddr(t), "-lease-ttl", "2s", "-cleanup-interval", "500ms")
	}
	workerA := run("a")

	var pubErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, m := range order {
			if err := publishInput(ctx, js, tenant, m); err != nil {
				pubErr = err
				return
			}
			time.Sleep(pace/2 + time.Duration(rand.Int64N(int64(pace))))
		}
	}()

	for range kills {
		time.Sleep(time.Duration(300+rand.IntN(1200)) * time.Millisecond)
		kill(t, workerA)
		workerA = run("a")
	}
	// Failover: a second worker joins, the first dies for good; the
	// second must carry on within 10 s.
	run("b")
	time.Sleep(time.Duration(500+rand.IntN(1000)) * time.Millisecond)
	kill(t, workerA)
	died := time.Now()
	atDeath := totalEvents(t, ctx, js, tenant, cgs)
	want := wantTotal(cgs)
	t.Logf("%d inputs, %d kills; %d of %d events stored when the first worker died for good", len(order), kills+1, atDeath, want)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got := totalEvents(t, ctx, js, tenant, cgs)
		if got >= want {
			break
		}
		if got == atDeath && time.Since(died) > 10*time.Second {
			t.Fatalf("no progress within 10 s of the first worker's death (%d of %d events)", got, want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events after 3 minutes", got, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
	wg.Wait()
	if pubErr != nil {
		t.Fatal(pubErr)
	}
	time.Sleep(time.Second) // let any duplicate land before counting
	for _, cg := range cgs {
		for _, client := range cg.members {
			checkClient(t, ctx, js, tenant, client, cg)
		}
	}
}

// interleave merges the groups' input lists (each n long, in order) by
// taking from a random group each time.
func interleave(all []testpeer.Message, groups, n int) []testpeer.Message {
	next := make([]int, groups)
	var out []testpeer.Message
	for len(out) < len(all) {
		g := rand.IntN(groups)
		if next[g] == n {
			continue
		}
		out = append(out, all[g*n+next[g]])
		next[g]++
	}
	return out
}

func publishInput(ctx context.Context, js jetstream.JetStream, tenant string, m testpeer.Message) error {
	c, err := engine.Classify(m.MLS)
	if err != nil {
		return err
	}
	idHex := hex.EncodeToString(m.ID)
	subj, err := subject.Input(tenant, hex.EncodeToString(m.Transport.Group), idHex)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(subj)
	msg.Data = m.MLS
	msg.Header.Set(jetstream.MsgIDHeader, tenant+"."+idHex)
	msg.Header.Set(bus.HeaderClass, string(c.Class))
	msg.Header.Set(bus.HeaderMessageID, idHex)
	_, err = js.PublishMsg(ctx, msg)
	return err
}

func kill(t *testing.T, p *process) {
	t.Helper()
	if err := p.cmd.Process.Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

func wantTotal(cgs []*chaosGroup) int {
	n := 0
	for _, cg := range cgs {
		n += len(cg.members) * (1 + len(cg.sent))
	}
	return n
}

func totalEvents(t *testing.T, ctx context.Context, js jetstream.JetStream, tenant string, cgs []*chaosGroup) int {
	n := 0
	for _, cg := range cgs {
		for _, c := range cg.members {
			n += len(clientEvents(t, ctx, js, tenant, c))
		}
	}
	return n
}

// clientEvents reads a client's converge events from FABRIC_EVENTS.
func clientEvents(t *testing.T, ctx context.Context, js jetstream.JetStream, tenant, client string) []bus.Delivered {
	t.Helper()
	subj, err := subject.Events(tenant, client)
	if err != nil {
		t.Fatal(err)
	}
	var out []bus.Delivered
	for _, m := range storedOn(t, ctx, js, subj) {
		d, err := bus.DecodeStored(m)
		if err != nil {
			t.Fatal(err)
		}
		if d.Event.Kind != schema.KindIdentityRegistered {
			out = append(out, d)
		}
	}
	return out
}

// checkClient: joined first, then every message exactly once in send order.
func checkClient(t *testing.T, ctx context.Context, js jetstream.JetStream, tenant, client string, cg *chaosGroup) {
	t.Helper()
	evs := clientEvents(t, ctx, js, tenant, client)
	if len(evs) != 1+len(cg.sent) {
		t.Errorf("client %.8s has %d events, want %d", client, len(evs), 1+len(cg.sent))
		return
	}
	if evs[0].Event.Kind != schema.KindConversationJoined {
		t.Errorf("client %.8s: first event %s", client, evs[0].Event.Kind)
	}
	for i, id := range cg.sent {
		r := evs[i+1].Event.MessageReceived
		if r == nil || !r.MessageID.Equal(id) || !r.GroupID.Equal(cg.id) {
			t.Errorf("client %.8s: event %d is not message %d of its group", client, i+1, i)
			return
		}
	}
}
