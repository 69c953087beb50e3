package fanout

import (
	"bufio"
	"net/http"
	"strings"
	"testing"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// An SSE URL without kinds selects every kind, so a plain EventSource on
// /v1/tenants/{tenant}/clients/{client_id}/events works; kinds= (present,
// empty) still selects none.
func TestSSEWithoutKindsSelectsEveryKind(t *testing.T) {
	e := newEnv(t)
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, e.srv.URL+"/v1/tenants/"+tenantA+"/clients/"+client1+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token(t, tenantA, client1))
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("SSE without kinds: %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	if l, err := br.ReadString('\n'); err != nil || l != ": subscribed\n" {
		t.Fatalf("first line %q, %v", l, err)
	}
	e.publish(tenantA, client1, published{ev: received(groupA, 1, &text)})
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if kind, ok := strings.CutPrefix(strings.TrimSuffix(l, "\n"), "event: "); ok {
			if kind != string(schema.KindMessageReceived) {
				t.Fatalf("event %q", kind)
			}
			return
		}
	}
}
