package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fabric-mls/fabric/internal/auth"
)

// Run is the worker's one lifecycle: it takes input once Started is closed,
// and when its context ends it drains and returns, after which nothing
// answers intake and the worker is not ready.
func TestRunTakesInputUntilItsContextEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{none: true})
	nc, err := e.connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	v, err := auth.NewVerifier(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{Conn: nc, Verifier: v, Vault: testVault, NATSIntake: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case <-svc.Started():
	case err := <-done:
		t.Fatalf("Run ended before taking input: %v", err)
	}
	body, _ := json.Marshal(wire{V: 1, Group: []byte{1}, Kind: "mls", Payload: []byte{0}})
	reply, err := e.natsRequest(t, testTenant, nil, body)
	if err != nil || statusOf(t, reply) != http.StatusOK {
		t.Fatalf("intake while running: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v after its context ended", err)
	}
	if svc.Ready() == nil {
		t.Fatal("ready after Run returned")
	}
	if _, err := e.natsRequest(t, testTenant, nil, body); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("intake after Run returned: %v, want no responders", err)
	}
}
