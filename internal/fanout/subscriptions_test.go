package fanout

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// The console lists a tenant's live subscriptions with their queue against
// the bound (EVENT-030) and their losses (EVENT-031), to admin tokens of
// that tenant only.
func TestSubscriptionsListedForTheConsole(t *testing.T) {
	e := newEnv(t)
	r := e.raw(token(t, tenantA, client1))
	r.subscribe(1, client1, schema.EventFilter{Kinds: schema.AllKinds()})
	other := e.raw(token(t, tenantB, client1))
	other.subscribe(1, client1, schema.EventFilter{Kinds: schema.AllKinds()})
	for range 3 {
		e.publish(tenantA, client1, published{ev: hmacUpdated()})
	}
	for range 3 {
		r.read() // sent, never credited: held
	}
	list := func(tok string) (int, SubscriptionList) {
		req, _ := http.NewRequestWithContext(e.ctx, http.MethodGet, e.srv.URL+"/v1/tenants/"+tenantA+"/subscriptions", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out SubscriptionList
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	code, got := list(mintToken(t, tenantA, []auth.Scope{auth.ScopeAdmin}, auth.AllClients))
	want := SubscriptionInfo{ClientID: client1, Transport: "websocket", Held: 3, Capacity: 1024}
	if code != http.StatusOK || len(got.Subscriptions) != 1 || got.Subscriptions[0] != want {
		t.Fatalf("%d %+v, want only %+v", code, got, want)
	}
	if code, _ := list(token(t, tenantA, client1)); code != http.StatusForbidden {
		t.Fatalf("an events token: %d, want 403", code)
	}
	if code, _ := list(mintToken(t, tenantB, []auth.Scope{auth.ScopeAdmin}, auth.AllClients)); code != http.StatusForbidden {
		t.Fatalf("another tenant's admin token: %d, want 403", code)
	}
}
