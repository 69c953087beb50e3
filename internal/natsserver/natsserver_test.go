package natsserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// roundTrip stores one message in a fresh stream and reads it back.
func roundTrip(t *testing.T, nc *nats.Conn) {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RT", Subjects: []string{"rt.>"}})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	ack, err := js.Publish(ctx, "rt.a", []byte("hello"))
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	m, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if string(m.Data) != "hello" {
		t.Fatalf("got %q", m.Data)
	}
}

func TestStartLoopback(t *testing.T) {
	s, err := Start(testCtx(t, 10*time.Second), Options{StoreDir: t.TempDir(), Port: RandomPort})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if u := s.ClientURL(); !strings.HasPrefix(u, "nats://127.0.0.1:") || strings.HasSuffix(u, ":-1") {
		t.Fatalf("client url %q is not a concrete loopback address", u)
	}
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	roundTrip(t, nc)
}

func TestStartInProcess(t *testing.T) {
	s, err := Start(testCtx(t, 10*time.Second), Options{StoreDir: t.TempDir(), InProcess: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if u := s.ClientURL(); u != "" {
		t.Fatalf("in-process server has client url %q", u)
	}
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	roundTrip(t, nc)
}

// A client port another process holds fails Start with the server's own
// error naming the address, not a readiness timeout that hides it.
func TestStartOnBusyPortNamesTheAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	s, err := Start(testCtx(t, 5*time.Second), Options{StoreDir: t.TempDir(), Port: port})
	if err == nil {
		s.Shutdown()
		t.Fatal("Start succeeded on a busy port")
	}
	if addr := ln.Addr().String(); !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Start: %v; want the busy address %s and why", err, addr)
	}
}

func TestStartRequiresStoreDir(t *testing.T) {
	if _, err := Start(context.Background(), Options{Port: RandomPort}); err == nil {
		t.Fatal("Start without StoreDir succeeded")
	}
}

func TestRestartKeepsPortAndData(t *testing.T) {
	ctx := testCtx(t, 20*time.Second)
	s, err := Start(ctx, Options{StoreDir: t.TempDir(), Port: RandomPort})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	url := s.ClientURL()
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, nc)
	nc.Close()

	s.Shutdown()
	s.Shutdown() // idempotent
	if s.Running() {
		t.Fatal("running after Shutdown")
	}
	if _, err := s.Connect(); err == nil {
		t.Fatal("Connect after Shutdown succeeded")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s.ClientURL() != url {
		t.Fatalf("restart moved from %s to %s", url, s.ClientURL())
	}
	nc, err = s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(ctx, "RT")
	if err != nil {
		t.Fatalf("stream lost across restart: %v", err)
	}
	if m, err := st.GetLastMsgForSubject(ctx, "rt.a"); err != nil || string(m.Data) != "hello" {
		t.Fatalf("message lost across restart: %v", err)
	}
}

// TestClusterSurvivesNodeLoss publishes to an R3 stream, stops one node,
// keeps publishing and reads back every message.
func TestClusterSurvivesNodeLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test in -short mode")
	}
	ctx := testCtx(t, 60*time.Second)
	c, err := StartCluster(ctx, 3, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()

	nc, err := c.Connect(nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3, Storage: jetstream.FileStorage,
	}); err != nil {
		t.Fatalf("create R3 stream: %v", err)
	}

	const perPhase = 50
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if err := publishRetry(ctx, js, fmt.Sprintf("r3.%d", i), fmt.Sprintf("m%d", i)); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
	}
	publish(0, perPhase)

	// Stop the node this connection is on, so the client must fail over too.
	var victim int
	for i, s := range c.Nodes() {
		if s.ClientURL() == nc.ConnectedUrl() {
			victim = i
		}
	}
	c.Node(victim).Shutdown()
	publish(perPhase, 2*perPhase)

	st, err := js.Stream(ctx, "R3")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 * perPhase {
		m, err := st.GetLastMsgForSubject(ctx, fmt.Sprintf("r3.%d", i))
		if err != nil {
			t.Fatalf("message %d lost: %v", i, err)
		}
		if want := fmt.Sprintf("m%d", i); string(m.Data) != want {
			t.Fatalf("message %d = %q, want %q", i, m.Data, want)
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2*perPhase {
		t.Fatalf("stream holds %d messages, want %d", info.State.Msgs, 2*perPhase)
	}

	if err := c.Restart(ctx, victim); err != nil {
		t.Fatalf("restart node %d: %v", victim, err)
	}
}

// publishRetry publishes with a message id so a retry after a lost ack
// during failover cannot store the message twice.
func publishRetry(ctx context.Context, js jetstream.JetStream, subj, data string) error {
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.Publish(pctx, subj, []byte(data), jetstream.WithMsgID(subj))
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return errors.Join(err, ctx.Err())
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// A listener beyond loopback without users would let anyone who reaches
// it read and write every stream: Start refuses it.
func TestNonLoopbackListenerNeedsUsers(t *testing.T) {
	_, err := Start(testCtx(t, 10*time.Second), Options{StoreDir: t.TempDir(), Host: "0.0.0.0", Port: RandomPort})
	if err == nil || !strings.Contains(err.Error(), "needs users") {
		t.Fatalf("0.0.0.0 without users: %v", err)
	}
	s, err := Start(testCtx(t, 10*time.Second), Options{StoreDir: t.TempDir(), Host: "0.0.0.0", Port: RandomPort,
		Users: []*server.User{{Username: "u", Password: "p"}}})
	if err != nil {
		t.Fatalf("0.0.0.0 with users: %v", err)
	}
	s.Shutdown()
}
