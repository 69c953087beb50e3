package operations

import (
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/fabric-mls/fabric/internal/apppayload"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func accepted(t *testing.T, name string, a answer) schema.OperationAccepted {
	t.Helper()
	var acc schema.OperationAccepted
	if a.status != http.StatusAccepted {
		t.Fatalf("%s: %d %s, want 202", name, a.status, a.body)
	}
	if err := json.Unmarshal(a.body, &acc); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return acc
}

// Issue 26 item 2: an Idempotency-Key is scoped by the route and the
// conversation. The same key and request is the same operation over HTTP
// and NATS; the same key with another request on the same route and
// conversation is 409 idempotency_key_reused over both; the same key on
// another conversation, or on a create, is another operation (a create's
// group is its own, not a group named after a send's operation).
func TestIdempotencyKeyReusedWithAnotherRequestIs409(t *testing.T) {
	e := newOpsEnv(t)
	send := token(t, auth.ScopeSend)
	g1, g2 := strings.Repeat("01", 32), strings.Repeat("02", 32)
	msg := func(group, text string) request {
		return request{verb: "send_message", method: http.MethodPost, path: "/conversations/{group_id}/messages", token: send, key: "k", group: group, body: []byte(`{"text":"` + text + `"}`)}
	}
	first := accepted(t, "send", e.http(msg(g1, "hi")))
	if again := accepted(t, "send again over NATS", e.nats(msg(g1, "hi"))); !again.OperationID.Equal(first.OperationID) {
		t.Fatalf("the same request over NATS is operation %x, want %x", again.OperationID, first.OperationID)
	}
	for name, a := range map[string]answer{"HTTP": e.http(msg(g1, "other")), "NATS": e.nats(msg(g1, "other"))} {
		if a.status != http.StatusConflict || !strings.Contains(string(a.body), `"code":"idempotency_key_reused"`) {
			t.Errorf("another text with the key over %s: %d %s, want 409 idempotency_key_reused", name, a.status, a.body)
		}
	}
	other := accepted(t, "send to another conversation", e.http(msg(g2, "hi")))
	if other.OperationID.Equal(first.OperationID) {
		t.Fatal("the key on another conversation names the same operation")
	}
	create := accepted(t, "create", e.nats(request{verb: "create_conversation", method: http.MethodPost, path: "/conversations", token: send, key: "k", body: []byte(`{"name":"team"}`)}))
	if create.OperationID.Equal(first.OperationID) || create.OperationID.Equal(other.OperationID) ||
		!create.GroupID.Equal(bus.OperationGroupID(create.OperationID)) {
		t.Fatalf("create %x of group %x with the key of the sends %x, %x", create.OperationID, create.GroupID, first.OperationID, other.OperationID)
	}
	if hex.EncodeToString(create.GroupID) == g1 {
		t.Fatal("the create names the send's conversation")
	}
}

// Issue 26 item 3: a send whose content, encoded, is larger than the
// fabric can seal and send under the server's max_payload
// (bus.MaxSendPayload) is 413 payload_too_large over HTTP and NATS, up
// front; one at the bound is accepted.
func TestSendOverTheBoundIs413(t *testing.T) {
	e := newOpsEnv(t)
	send := token(t, auth.ScopeSend)
	group := strings.Repeat("01", 32)
	bound := bus.MaxSendPayload(e.nc.MaxPayload())
	text := strings.Repeat("x", bound)
	for {
		p, err := apppayload.Encode(apppayload.NewText(text))
		if err != nil {
			t.Fatal(err)
		}
		if len(p) <= bound {
			break
		}
		text = text[:len(text)-(len(p)-bound)]
	}
	q := func(key, text string) request {
		return request{verb: "send_message", method: http.MethodPost, path: "/conversations/{group_id}/messages", token: send, key: key, group: group, body: []byte(`{"text":"` + text + `"}`)}
	}
	accepted(t, "send at the bound over HTTP", e.http(q("at-http", text)))
	accepted(t, "send at the bound over NATS", e.nats(q("at-nats", text)))
	for name, a := range map[string]answer{"HTTP": e.http(q("over", text+"x")), "NATS": e.nats(q("over", text+"x"))} {
		if a.status != http.StatusRequestEntityTooLarge || !strings.Contains(string(a.body), `"code":"payload_too_large"`) {
			t.Errorf("one byte over the bound over %s: %d %s, want 413 payload_too_large", name, a.status, a.body)
		}
	}
}
