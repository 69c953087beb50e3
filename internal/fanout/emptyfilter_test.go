package fanout

import (
	"context"
	"fmt"
	"testing"

	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// Issue 28, item 5: a filter that names no kinds selects every kind on the
// WebSocket, as no kinds parameter does on SSE and as the console and
// `fabric tail` have it: the Go SDK's EventFilter{} (msgpack and JSON) and
// a page's filter {} (a JSON frame without a kinds member) each receive an
// event of every kind published, not nothing.
func TestFilterWithoutKindsSelectsEveryKind(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	subs := map[string]*client.Subscription{}
	for name, opts := range map[string][]client.Option{"sdk msgpack": nil, "sdk json": {client.WithJSON()}} {
		s, err := e.connect(tenantA, []string{client1}, opts...).Subscribe(ctx, client1, schema.EventFilter{})
		if err != nil {
			t.Fatalf("%s: subscribe with EventFilter{}: %v", name, err)
		}
		subs[name] = s
	}
	r := e.raw(token(t, tenantA, client1))
	r.sendRaw(fmt.Appendf(nil, `{"op":"subscribe","id":1,"client_id":%q,"filter":{}}`, client1))
	got := r.read()
	if got.Op != wire.OpSubscribed || got.ID != 1 {
		t.Fatalf("raw subscribe with filter {}: got %+v, want subscribed", got)
	}

	events := []schema.ClientEvent{
		received(groupA, 1, &text),
		{Kind: schema.KindConsentChanged, ConsentChanged: &schema.ConsentChanged{EntityKind: schema.ConsentEntityConversation,
			Entity: fmt.Sprintf("%x", groupA), State: schema.ConsentAllowed}},
		hmacUpdated(),
	}
	for _, ev := range events {
		e.publish(tenantA, client1, published{ev: ev})
	}
	for _, want := range events {
		for name, s := range subs {
			if ev := next(t, s); ev.Kind != want.Kind {
				t.Errorf("%s: got %s, want %s", name, ev.Kind, want.Kind)
			}
		}
		f := r.read()
		if f.Op != wire.OpEvent {
			t.Fatalf("raw: got %+v, want an event", f)
		}
		if ev := decodeJSONEvent(t, f.Event); ev.Kind != want.Kind {
			t.Errorf("raw: got %s, want %s", ev.Kind, want.Kind)
		}
	}
}
