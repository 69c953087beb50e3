package fanout

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// A subscription for a client id the tenant does not host is refused with
// unknown_client, on WebSocket and SSE (404), instead of waiting in silence
// for events that can never come; a client whose record is deleted is no
// client either.
func TestSubscribeToUnknownClientIsRefused(t *testing.T) {
	e := newEnv(t)
	const ghost = "0bad"
	c := e.connect(tenantA, []string{"*"})
	_, err := c.Subscribe(context.Background(), ghost, schema.EventFilter{Kinds: recvKinds})
	var pe *client.GatewayError
	if !errors.As(err, &pe) || pe.Code != wire.CodeUnknownClient {
		t.Fatalf("WebSocket subscribe for an unknown client: %v, want %s", err, wire.CodeUnknownClient)
	}
	if code := sseStatus(t, e, "/v1/tenants/"+tenantA+"/clients/"+ghost+"/events", token(t, tenantA, ghost)); code != http.StatusNotFound {
		t.Fatalf("SSE for an unknown client: %d, want 404", code)
	}
	kv, err := e.js.KeyValue(e.ctx, streams.BucketClients)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(e.ctx, tenantA+"."+client2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Subscribe(context.Background(), client2, schema.EventFilter{Kinds: recvKinds}); !errors.As(err, &pe) || pe.Code != wire.CodeUnknownClient {
		t.Fatalf("subscribe for a deleted client: %v", err)
	}
	if _, err := c.Subscribe(context.Background(), client1, schema.EventFilter{Kinds: recvKinds}); err != nil {
		t.Fatalf("subscribe for a hosted client: %v", err)
	}
}
