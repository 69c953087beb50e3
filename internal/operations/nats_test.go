package operations

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	tenant = "acme"
	client = "c0ffee"
)

var secret = []byte(strings.Repeat("s", 32))

// hostedClients hosts one client.
type hostedClients struct{ inbox string }

func (h hostedClients) ClientInbox(_ context.Context, t, c string) (string, error) {
	if t != tenant || c != client {
		return "", clientstore.ErrUnknownClient
	}
	return h.inbox, nil
}

// answer is what one request got, over either transport.
type answer struct {
	status      int
	contentType string
	body        []byte
	code        string // Fabric-Error (NATS only)
}

// request is one operation request as a test writes it: the verb (the
// NATS subject's last token) and the HTTP route it stands for.
type request struct {
	verb, method, path string
	client             string
	token, key         string
	group, inbox, opID string
	contentType        string
	body               []byte
}

type opsEnv struct {
	t   *testing.T
	nc  *nats.Conn
	srv *httptest.Server
}

func newOpsEnv(t *testing.T) *opsEnv {
	t.Helper()
	n := natstest.Start(t)
	verifier, err := auth.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	api := New(Config{JS: n.JS, Verifier: verifier, Clients: hostedClients{inbox: strings.Repeat("ab", 32)}})
	mux := http.NewServeMux()
	api.Mount(mux)
	srv := httptest.NewServer(mux)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := api.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait(); srv.Close() })
	// The queue subscription is on the server once a request finds it.
	e := &opsEnv{t: t, nc: n.Conn, srv: srv}
	eventually.NoError(t, func() error {
		_, err := n.Conn.Request(must(subject.OperateRequest(tenant, client, VerbOperation)), nil, time.Second)
		return err
	})
	return e
}

func must(s string, err error) string {
	if err != nil {
		panic(err)
	}
	return s
}

func token(t *testing.T, scopes ...auth.Scope) string {
	t.Helper()
	tok, err := auth.Mint(secret, auth.Claims{Tenant: tenant, Scopes: scopes, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (e *opsEnv) http(q request) answer {
	e.t.Helper()
	c := q.client
	if c == "" {
		c = client
	}
	path := strings.NewReplacer("{group_id}", q.group, "{inbox_id}", q.inbox, "{operation_id}", q.opID).Replace(q.path)
	r, err := http.NewRequest(q.method, e.srv.URL+"/v1/tenants/"+tenant+"/clients/"+c+path, bytes.NewReader(q.body))
	if err != nil {
		e.t.Fatal(err)
	}
	e.headers(q, func(k, v string) { r.Header.Set(k, v) })
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return answer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: b}
}

func (e *opsEnv) nats(q request) answer {
	e.t.Helper()
	c := q.client
	if c == "" {
		c = client
	}
	m := nats.NewMsg(must(subject.OperateRequest(tenant, c, q.verb)))
	m.Data = q.body
	e.headers(q, func(k, v string) { m.Header.Set(k, v) })
	if q.group != "" {
		m.Header.Set(HeaderGroupID, q.group)
	}
	if q.inbox != "" {
		m.Header.Set(HeaderInboxID, q.inbox)
	}
	if q.opID != "" {
		m.Header.Set(bus.HeaderOperationID, q.opID)
	}
	reply, err := e.nc.RequestMsg(m, 10*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	var status int
	if err := json.Unmarshal([]byte(reply.Header.Get(bus.HeaderReplyStatus)), &status); err != nil {
		e.t.Fatalf("reply without %s: %v", bus.HeaderReplyStatus, err)
	}
	return answer{status: status, contentType: reply.Header.Get("Content-Type"), body: reply.Data, code: reply.Header.Get(bus.HeaderReplyError)}
}

func (e *opsEnv) headers(q request, set func(k, v string)) {
	if q.token != "" {
		set("Authorization", "Bearer "+q.token)
	}
	if q.key != "" {
		set(HeaderIdempotencyKey, q.key)
	}
	ct := q.contentType
	if ct == "" && len(q.body) > 0 {
		ct = "application/json"
	}
	if ct != "" {
		set("Content-Type", ct)
	}
}

// Issue 19: operations on NATS request-reply are the HTTP API's. Each
// request goes once over HTTP and once over NATS with the same
// Idempotency-Key: both get the same status and the same body (so the
// same operation id: the key names one operation whichever way it
// came), a refusal's code in Fabric-Error is the body's, and JSON or
// msgpack is answered as asked.
func TestOperationsOverNATSAnswerAsHTTP(t *testing.T) {
	e := newOpsEnv(t)
	send := token(t, auth.ScopeSend)
	admin := token(t, auth.ScopeAdmin)
	events := token(t, auth.ScopeEvents)
	created := e.http(request{method: http.MethodPost, path: "/conversations", token: send, key: "create-0", body: []byte(`{"name":"team"}`)})
	var acc schema.OperationAccepted
	if err := json.Unmarshal(created.body, &acc); err != nil || created.status != http.StatusAccepted {
		t.Fatalf("create over HTTP: %d %s", created.status, created.body)
	}
	group := hex.EncodeToString(acc.GroupID)
	peer, err := testpeer.New("bob")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := peer.KeyPackage()
	if err != nil {
		t.Fatal(err)
	}
	addBody, err := json.Marshal(schema.AddMembers{KeyPackages: []schema.Bytes{kp}})
	if err != nil {
		t.Fatal(err)
	}
	sendMsgpack, err := msgpack.Marshal(map[string]string{"text": "packed"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		q      request
		status int
		code   string
	}{
		{"create", request{verb: "create_conversation", method: http.MethodPost, path: "/conversations", token: send, key: "create-1", body: []byte(`{"name":"team"}`)}, 202, ""},
		{"send", request{verb: "send_message", method: http.MethodPost, path: "/conversations/{group_id}/messages", token: send, key: "send-1", group: group, body: []byte(`{"text":"hi"}`)}, 202, ""},
		{"send msgpack", request{verb: "send_message", method: http.MethodPost, path: "/conversations/{group_id}/messages", token: send, key: "send-2", group: group, contentType: httpapi.ContentTypeMsgpack, body: sendMsgpack}, 202, ""},
		{"admin implies send", request{verb: "send_message", method: http.MethodPost, path: "/conversations/{group_id}/messages", token: admin, key: "send-3", group: group, body: []byte(`{"text":"hi"}`)}, 202, ""},
		{"add", request{verb: "add_members", method: http.MethodPost, path: "/conversations/{group_id}/members", token: send, key: "add-1", group: group, body: addBody}, 202, ""},
		{"remove", request{verb: "remove_member", method: http.MethodDelete, path: "/conversations/{group_id}/members/{inbox_id}", token: send, key: "remove-1", group: group, inbox: peer.InboxID()}, 202, ""},
		{"rename", request{verb: "update_conversation", method: http.MethodPatch, path: "/conversations/{group_id}", token: send, key: "rename-1", group: group, body: []byte(`{"name":"renamed"}`)}, 202, ""},
		{"leave", request{verb: "leave", method: http.MethodPost, path: "/conversations/{group_id}/leave", token: send, key: "leave-1", group: group}, 202, ""},
		{"self-update", request{verb: "self_update", method: http.MethodPost, path: "/conversations/{group_id}/update", token: send, key: "update-1", group: group}, 202, ""},
		{"record", request{verb: VerbOperation, method: http.MethodGet, path: "/operations/{operation_id}", token: send, opID: hex.EncodeToString(acc.OperationID)}, 200, ""},
		{"no record", request{verb: VerbOperation, method: http.MethodGet, path: "/operations/{operation_id}", token: send, opID: strings.Repeat("0", 64)}, 404, "operation_not_found"},
		{"no key", request{verb: "send_message", method: http.MethodPost, path: "/conversations/{group_id}/messages", token: send, group: group, body: []byte(`{"text":"hi"}`)}, 400, "bad_request"},
		{"bad body", request{verb: "send_message", method: http.MethodPost, path: "/conversations/{group_id}/messages", token: send, key: "bad-1", group: group, body: []byte(`{"text":`)}, 400, "bad_request"},
		{"bad KeyPackage", request{verb: "add_members", method: http.MethodPost, path: "/conversations/{group_id}/members", token: send, key: "add-2", group: group, body: []byte(`{"key_packages":["00"]}`)}, 400, "bad_request"},
		{"no token", request{verb: "send_message", method: http.MethodPost, path: "/conversations/{group_id}/messages", key: "send-4", group: group, body: []byte(`{"text":"hi"}`)}, 401, "unauthenticated"},
		{"no send scope", request{verb: "send_message", method: http.MethodPost, path: "/conversations/{group_id}/messages", token: events, key: "send-5", group: group, body: []byte(`{"text":"hi"}`)}, 403, "forbidden"},
		{"unknown client", request{verb: "leave", method: http.MethodPost, path: "/conversations/{group_id}/leave", client: "dead", token: send, key: "leave-2", group: group}, 404, "client_not_found"},
	}
	for _, c := range cases {
		h, n := e.http(c.q), e.nats(c.q)
		if h.status != c.status {
			t.Errorf("%s: HTTP %d %s, want %d", c.name, h.status, h.body, c.status)
		}
		if n.status != h.status || n.contentType != h.contentType || !bytes.Equal(n.body, h.body) {
			t.Errorf("%s: NATS %d %s %s, HTTP %d %s %s", c.name, n.status, n.contentType, n.body, h.status, h.contentType, h.body)
		}
		if n.code != c.code {
			t.Errorf("%s: Fabric-Error %q, want %q", c.name, n.code, c.code)
		}
		if c.code != "" && !bytes.Contains(n.body, []byte(`"code":"`+c.code+`"`)) {
			t.Errorf("%s: body %s does not carry the code", c.name, n.body)
		}
	}
}

// Requests that only NATS can make wrong: a verb that names no operation,
// a group operation without its group, are refused as bad requests.
func TestOperationsOverNATSRefuseWhatNamesNoOperation(t *testing.T) {
	e := newOpsEnv(t)
	send := token(t, auth.ScopeSend)
	for name, q := range map[string]request{
		"no such verb": {verb: "explode", token: send, key: "k1", body: []byte(`{}`)},
		"no group":     {verb: "send_message", token: send, key: "k2", body: []byte(`{"text":"hi"}`)},
	} {
		if a := e.nats(q); a.status != http.StatusBadRequest || a.code != "bad_request" {
			t.Errorf("%s: %d %s %s", name, a.status, a.code, a.body)
		}
	}
}
