package ingest

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

type errorBody struct {
	Error struct {
		Code    string `json:"code" msgpack:"code"`
		Message string `json:"message" msgpack:"message"`
	} `json:"error" msgpack:"error"`
}

func wantError(t *testing.T, status int, body []byte, wantStatus int, wantCode, wantInMessage string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status = %d, want %d: %s", status, wantStatus, body)
	}
	var eb errorBody
	if err := json.Unmarshal(body, &eb); err != nil && decodeMsgpack(body, &eb) != nil {
		t.Fatalf("error body: %v: %s", err, body)
	}
	if eb.Error.Code != wantCode || !strings.Contains(eb.Error.Message, wantInMessage) {
		t.Fatalf("error = %s %q, want %s containing %q", eb.Error.Code, eb.Error.Message, wantCode, wantInMessage)
	}
}

// HTTP intake needs a token with scope ingest for the path's tenant.
func TestAuthRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	w := e.workers[0]
	g := newGroup(t)
	m := text(t, g, "x")
	body, _ := json.Marshal(wire{V: 1, Group: m.Transport.Group, Kind: "mls", Payload: m.Transport.Payload})
	for _, tc := range []struct {
		name, tok string
		status    int
		code      string
	}{
		{"no token", "", http.StatusUnauthorized, "unauthenticated"},
		{"bad token", "not-a-jwt", http.StatusUnauthorized, "unauthenticated"},
		{"other tenant", token(t, "other", auth.ScopeIngest), http.StatusForbidden, "forbidden"},
		{"other scope", token(t, testTenant, auth.ScopeEvents), http.StatusForbidden, "forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, b, _ := w.post(t, testTenant, tc.tok, "", body)
			wantError(t, status, b, tc.status, tc.code, "")
		})
	}
	if n := len(e.inputs()); n != 0 {
		t.Fatalf("refused requests reached FABRIC_IN: %d", n)
	}
	// A token of one tenant cannot read another tenant's outcomes either.
	req, _ := http.NewRequest(http.MethodGet, w.http.URL+"/v1/tenants/other/outcomes/"+hex.EncodeToString(m.ID), nil)
	req.Header.Set("Authorization", "Bearer "+token(t, testTenant, auth.ScopeIngest))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-tenant outcome read: status %d", resp.StatusCode)
	}
	// Something that is not a message id is a 400.
	req, _ = http.NewRequest(http.MethodGet, w.http.URL+"/v1/tenants/"+testTenant+"/outcomes/XYZ", nil)
	req.Header.Set("Authorization", "Bearer "+token(t, testTenant, auth.ScopeIngest))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad message id: status %d", resp.StatusCode)
	}
}

// Limits give clear 4xx errors naming what is wrong.
func TestLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{limits: Limits{MaxBodyBytes: 64 << 10, MaxBatch: 3, MaxMessageBytes: 2048, RatePerTenant: 1, BurstPerTenant: 6}})
	w := e.workers[0]
	tok := token(t, testTenant, auth.ScopeIngest)
	g := newGroup(t)
	e.hostGroup(g.ID())
	msg := func(payload []byte) wire { return wire{V: 1, Group: g.ID(), Kind: "mls", Payload: payload} }
	post := func(v any) (int, []byte, http.Header) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return w.post(t, testTenant, tok, "", b)
	}

	status, b, _ := w.post(t, testTenant, tok, "", bytes.Repeat([]byte(" "), 65<<10))
	wantError(t, status, b, http.StatusRequestEntityTooLarge, "body_too_large", "")
	status, b, _ = post(map[string]any{"messages": []wire{msg([]byte{1}), msg([]byte{1}), msg([]byte{1}), msg([]byte{1})}})
	wantError(t, status, b, http.StatusRequestEntityTooLarge, ErrBatchTooLarge.Code, "messages")
	status, b, _ = post(map[string]any{"messages": []wire{msg([]byte{1}), msg(make([]byte, 2049))}})
	wantError(t, status, b, http.StatusRequestEntityTooLarge, ErrMessageTooLarge.Code, "messages[1].payload")

	status, b, _ = w.post(t, testTenant, tok, "", []byte(`{"messages":[{"v":1,"group":"00","kind":"mls","payload":"0g"}]}`))
	wantError(t, status, b, http.StatusBadRequest, "bad_request", "messages[0].payload")
	status, b, _ = w.post(t, testTenant, tok, "", []byte(`{"v":1,"group":"00","kind":"mls","payload":"00","extra":1}`))
	wantError(t, status, b, http.StatusBadRequest, "bad_request", `unknown member "extra"`)
	status, b, _ = w.post(t, testTenant, tok, "", []byte(`{"v":2,"group":"00","kind":"mls","payload":"00"}`))
	wantError(t, status, b, http.StatusBadRequest, "bad_request", "message.v")
	status, b, _ = w.post(t, testTenant, tok, "", []byte(`{"v":1,"group":"00","kind":"mls"}`))
	wantError(t, status, b, http.StatusBadRequest, "bad_request", "message.payload")
	status, b, _ = w.post(t, testTenant, tok, "", []byte(`{"v":1,"group":"00","kind":"carrier-pigeon","payload":"00"}`))
	wantError(t, status, b, http.StatusBadRequest, "bad_request", "message.kind")
	status, b, _ = w.post(t, testTenant, tok, "", []byte(`{"v":1,`))
	wantError(t, status, b, http.StatusBadRequest, "bad_request", "malformed JSON")
	status, b, _ = w.post(t, testTenant, tok, httpapi.ContentTypeMsgpack, msgpackBody(t, map[string]any{"messages": []map[string]any{{"v": 1, "group": []byte{0}, "kind": 7, "payload": []byte{0}}}}))
	wantError(t, status, b, http.StatusBadRequest, "bad_request", "messages[0].kind")

	// Six tokens of burst at one per second: 3 + 3 pass, the next is 429.
	for range 2 {
		m1, m2, m3 := text(t, g, "a"), text(t, g, "b"), text(t, g, "c")
		status, b, _ = post(map[string]any{"messages": []wire{msg(m1.MLS), msg(m2.MLS), msg(m3.MLS)}})
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, b)
		}
	}
	status, b, hdr := post(msg(text(t, g, "d").MLS))
	wantError(t, status, b, http.StatusTooManyRequests, ErrRateLimited.Code, "")
	if hdr.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	// Another tenant has its own bucket.
	other := token(t, "other", auth.ScopeIngest)
	body, _ := json.Marshal(msg([]byte{0}))
	if status, b, _ := w.post(t, "other", other, "", body); status != http.StatusOK {
		t.Fatalf("other tenant: status %d: %s", status, b)
	}
}

// msgpack bodies work both ways, and batch results come in input order.
func TestMsgpackBatchInInputOrder(t *testing.T) {
	t.Parallel()
	_, w, g := hostedGroup(t)
	a, b := text(t, g, "a"), text(t, g, "b")
	junk := []byte{9, 9, 9}
	batch := map[string]any{"messages": []map[string]any{
		{"v": 1, "group": g.ID(), "kind": "mls", "payload": a.MLS},
		{"v": 1, "group": g.ID(), "kind": "mls", "payload": junk},
		{"v": 1, "group": g.ID(), "kind": "mls", "payload": b.MLS},
		{"v": 1, "group": g.ID(), "kind": "mls", "payload": a.MLS},
	}}
	status, body, _ := w.post(t, testTenant, token(t, testTenant, auth.ScopeIngest), httpapi.ContentTypeMsgpack, msgpackBody(t, batch))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	var r Response
	if err := decodeMsgpack(body, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Results) != 4 {
		t.Fatalf("%d results", len(r.Results))
	}
	wantResult(t, r.Results[0], a.ID, schema.StatusQueued, "")
	wantResult(t, r.Results[1], nil, schema.StatusRejected, schema.CategoryInvalidEncoding)
	wantResult(t, r.Results[2], b.ID, schema.StatusQueued, "")
	wantResult(t, r.Results[3], a.ID, schema.StatusRejected, schema.CategoryDuplicate)
}

// NATS intake answers with the HTTP body and status; with tokens required
// it refuses a request without one or for another tenant.
func TestNATSIntake(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{token: true})
	g := newGroup(t)
	e.hostGroup(g.ID())
	m := text(t, g, "over nats")
	body, _ := json.Marshal(wire{V: 1, Group: g.ID(), Kind: "mls", Payload: m.MLS})

	reply, err := e.natsRequest(t, testTenant, nil, body)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, statusOf(t, reply), reply.Data, http.StatusUnauthorized, "unauthenticated", "")
	hdr := nats.Header{}
	hdr.Set(HeaderAuthorization, "Bearer "+token(t, "other", auth.ScopeIngest))
	reply, err = e.natsRequest(t, testTenant, hdr, body)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, statusOf(t, reply), reply.Data, http.StatusForbidden, "forbidden", "")

	hdr.Set(HeaderAuthorization, "Bearer "+token(t, testTenant, auth.ScopeIngest))
	reply, err = e.natsRequest(t, testTenant, hdr, body)
	if err != nil {
		t.Fatal(err)
	}
	if statusOf(t, reply) != http.StatusOK {
		t.Fatalf("status %s: %s", reply.Header.Get(HeaderStatus), reply.Data)
	}
	var r Response
	if err := json.Unmarshal(reply.Data, &r); err != nil {
		t.Fatal(err)
	}
	wantResult(t, r.Results[0], m.ID, schema.StatusQueued, "")

	hdr.Set(HeaderContentType, httpapi.ContentTypeMsgpack)
	reply, err = e.natsRequest(t, testTenant, hdr, msgpackBody(t, map[string]any{"v": 1, "group": g.ID(), "kind": "mls", "payload": m.MLS}))
	if err != nil {
		t.Fatal(err)
	}
	if err := decodeMsgpack(reply.Data, &r); err != nil {
		t.Fatal(err)
	}
	wantResult(t, r.Results[0], m.ID, schema.StatusRejected, schema.CategoryDuplicate)

	// Limits and malformed bodies answer as HTTP would.
	hdr.Del(HeaderContentType)
	reply, err = e.natsRequest(t, testTenant, hdr, []byte(`{"messages":[{"v":1,"group":"00","kind":"mls","payload":"zz"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, statusOf(t, reply), reply.Data, http.StatusBadRequest, "bad_request", "messages[0].payload")
	reply, err = e.natsRequest(t, "Not-A-Tenant", hdr, body)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, statusOf(t, reply), reply.Data, http.StatusBadRequest, "bad_request", "tenant")
}

func statusOf(t *testing.T, m *nats.Msg) int {
	t.Helper()
	var s int
	if _, err := fmt.Sscan(m.Header.Get(HeaderStatus), &s); err != nil {
		t.Fatalf("reply without %s", HeaderStatus)
	}
	if code := m.Header.Get(HeaderError); (s != http.StatusOK) != (code != "") || !bytes.Contains(m.Data, []byte(code)) {
		t.Fatalf("reply %d with %s %q: %s", s, HeaderError, code, m.Data)
	}
	return s
}

// Two workers on one stream, every message delivered to both over both
// transports at once: every message lands on FABRIC_IN exactly once.
// A worker whose Start has returned answers NATS intake at once: its
// intake subscription has reached the server before it reports ready, so a
// request right after gets an answer, not "no responders".
func TestNATSIntakeAnswersOnceStarted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{none: true})
	body, _ := json.Marshal(wire{V: 1, Group: []byte{1}, Kind: "mls", Payload: []byte{0}})
	for i := range 10 {
		w := e.addWorker(envOpts{})
		reply, err := e.natsRequest(t, testTenant, nil, body)
		if err != nil {
			t.Fatalf("request %d right after Start: %v", i, err)
		}
		if statusOf(t, reply) != http.StatusOK {
			t.Fatalf("request %d: status %s: %s", i, reply.Header.Get(HeaderStatus), reply.Data)
		}
		if err := w.svc.Shutdown(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTwoWorkersExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{workers: 2})
	g := newGroup(t)
	e.hostGroup(g.ID())
	const n = 40
	msgs := make([]wire, n)
	want := map[string]bool{}
	for i := range msgs {
		m := text(t, g, fmt.Sprintf("m%d", i))
		msgs[i] = wire{V: 1, Group: g.ID(), Kind: "mls", Payload: m.MLS}
		want[hex.EncodeToString(m.ID)] = true
	}
	tok := token(t, testTenant, auth.ScopeIngest)
	queued := make(chan string, 4*n)
	var wg sync.WaitGroup
	for _, w := range e.workers {
		for _, viaNATS := range []bool{false, true} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range msgs {
					body, _ := json.Marshal(msgs[i])
					var data []byte
					if viaNATS {
						// The queue group picks a worker.
						hdr := nats.Header{}
						reply, err := e.natsRequest(t, testTenant, hdr, body)
						if err != nil {
							t.Error(err)
							return
						}
						data = reply.Data
					} else {
						status, b, _ := w.post(t, testTenant, tok, "", body)
						if status != http.StatusOK {
							t.Errorf("status %d: %s", status, b)
							return
						}
						data = b
					}
					var r Response
					if err := json.Unmarshal(data, &r); err != nil || len(r.Results) != 1 {
						t.Errorf("reply %s: %v", data, err)
						return
					}
					switch res := r.Results[0]; {
					case res.Status == schema.StatusQueued:
						queued <- hex.EncodeToString(res.MessageID)
					case res.Category != schema.CategoryDuplicate:
						t.Errorf("unexpected result %s/%s", res.Status, res.Category)
					}
				}
			}()
		}
	}
	wg.Wait()
	close(queued)
	got := map[string]int{}
	for id := range queued {
		got[id]++
	}
	for id := range want {
		if got[id] != 1 {
			t.Errorf("message queued %d times, want 1", got[id])
		}
	}
	in := e.inputs()
	if len(in) != n {
		t.Fatalf("FABRIC_IN holds %d messages, want %d", len(in), n)
	}
	stored := map[string]bool{}
	for _, m := range in {
		stored[storedID(t, m)] = true
	}
	for id := range want {
		if !stored[id] {
			t.Error("a message is missing from FABRIC_IN")
		}
	}
}

// After Shutdown a worker refuses new requests with 503, and requests
// finished before it are kept.
func TestShutdownRefusesNewInput(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	m := text(t, g, "before")
	wantResult(t, w.submitOne(t, m.Transport), m.ID, schema.StatusQueued, "")
	if err := w.svc.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if w.svc.Ready() == nil {
		t.Error("ready after shutdown")
	}
	body, _ := json.Marshal(wire{V: 1, Group: g.ID(), Kind: "mls", Payload: text(t, g, "after").MLS})
	status, b, _ := w.post(t, testTenant, token(t, testTenant, auth.ScopeIngest), "", body)
	wantError(t, status, b, http.StatusServiceUnavailable, ErrUnavailable.Code, "")
	e.wantInputs(1)
}

// A batch large enough to be peeled on several goroutines keeps input
// order, and its records and publishes all land.
func TestLargeBatchInInputOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	w := e.workers[0]
	g, stranger := newGroup(t), newGroup(t)
	e.hostGroup(g.ID())
	const n = 300
	msgs := make([]schema.TransportMessage, n)
	ids := make([][]byte, n)
	for i := range msgs {
		switch i % 3 {
		case 0, 1:
			m := text(t, g, "large "+strconv.Itoa(i))
			msgs[i], ids[i] = m.Transport, m.ID
		default:
			// Known bytes routed to an unknown group, for a retention
			// between the publishes.
			m := text(t, stranger, "elsewhere "+strconv.Itoa(i))
			msgs[i], ids[i] = m.Transport, m.ID
		}
	}
	res := w.submit(t, msgs...)
	for i, r := range res {
		if i%3 == 2 {
			wantResult(t, r, ids[i], schema.StatusRejected, schema.CategoryUnknownGroup)
			continue
		}
		wantResult(t, r, ids[i], schema.StatusQueued, "")
	}
	if got := len(e.inputs()); got != 2*n/3 {
		t.Fatalf("FABRIC_IN holds %d messages, want %d", got, 2*n/3)
	}
	for i := 0; i < n; i += 3 {
		w.wantOutcome(t, ids[i], schema.StatusQueued, "", schema.ClassApplication)
	}
}

// The hand-written msgpack answer is byte for byte what the struct tags
// give.
func TestResponseMsgpackMatchesTags(t *testing.T) {
	t.Parallel()
	type tagged Response // the same fields and tags, without EncodeMsgpack
	for _, r := range []Response{
		{},
		{Results: []Result{}},
		{Results: []Result{
			{MessageID: bytes.Repeat([]byte{7}, 32), Status: schema.StatusQueued},
			{MessageID: bytes.Repeat([]byte{9}, 32), Status: schema.StatusRejected, Category: schema.CategoryDuplicate},
			{Status: schema.StatusDeferred, Category: schema.CategoryTransportDeferred},
		}},
	} {
		got, err := msgpack.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		want, err := msgpack.Marshal(tagged(r))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%+v:\n got %x\nwant %x", r, got, want)
		}
	}
}

// Decoding is strict (docs/wire-formats.md): a member given twice is
// refused at every level of a transport body, in both formats, never
// decided by whichever came last.
func TestIntakeRefusesMemberGivenTwice(t *testing.T) {
	t.Parallel()
	lim := Limits{}.withDefaults()
	const msg = `"v":1,"group":"0a","kind":"mls","payload":"0001"`
	for _, body := range []string{
		`{"v":1,` + msg + `}`,
		`{` + msg + `,"payload":"0002"}`,
		`{` + msg + `,"group":"0b"}`,
		`{` + msg + `,"kind":"sealed"}`,
		`{` + msg + `,"\u0076":1}`,
		`{"messages":[{` + msg + `},{` + msg + `,"payload":"0002"}]}`,
		`{"messages":[{` + msg + `}],"messages":[{` + msg + `}]}`,
	} {
		_, err := decodeIntake([]byte(body), false, lim)
		var he *refusal.Error
		if !errors.As(err, &he) || !errors.Is(err, refusal.ErrBadRequest) || !strings.Contains(he.Message, "duplicate member") {
			t.Errorf("%s: err = %v, want 400 naming the duplicate member", body, err)
		}
	}
	// msgpack: a message map of five members, the fifth repeating one.
	twice := func(name string) []byte {
		one := msgpackBody(t, map[string]any{"v": 1, "group": []byte{1}, "kind": "mls", "payload": []byte{2}})
		again := msgpackBody(t, map[string]any{name: []byte{3}})
		return append(append([]byte{0x85}, one[1:]...), again[1:]...)
	}
	for _, body := range [][]byte{
		twice("v"),
		twice("payload"),
		append([]byte{0x81, 0xa8, 'm', 'e', 's', 's', 'a', 'g', 'e', 's', 0x91}, twice("group")...),
	} {
		_, err := decodeIntake(body, true, lim)
		var he *refusal.Error
		if !errors.As(err, &he) || !errors.Is(err, refusal.ErrBadRequest) || !strings.Contains(he.Message, "duplicate member") {
			t.Errorf("msgpack %x: err = %v, want 400 naming the duplicate member", body, err)
		}
	}
}

// Octets are bin in msgpack (docs/wire-formats.md): a group or payload
// given as a string is refused, alone or in a batch.
func TestIntakeRefusesOctetsAsString(t *testing.T) {
	t.Parallel()
	lim := Limits{}.withDefaults()
	for _, m := range []map[string]any{
		{"v": 1, "group": "\x01", "kind": "mls", "payload": []byte{2}},
		{"v": 1, "group": []byte{1}, "kind": "mls", "payload": "\x02"},
	} {
		for _, body := range [][]byte{msgpackBody(t, m), msgpackBody(t, map[string]any{"messages": []any{m}})} {
			_, err := decodeIntake(body, true, lim)
			var he *refusal.Error
			if !errors.As(err, &he) || !errors.Is(err, refusal.ErrBadRequest) || !strings.Contains(he.Message, "want bin") {
				t.Errorf("%x: err = %v, want 400 want bin", body, err)
			}
		}
	}
}

// sizedText is an application message of g whose MLS bytes are exactly
// size long.
func sizedText(t *testing.T, g *testpeer.Group, size int) testpeer.Message {
	t.Helper()
	n := size
	for range 4 {
		m := text(t, g, strings.Repeat("a", n))
		if len(m.MLS) == size {
			return m
		}
		n -= len(m.MLS) - size
	}
	t.Fatalf("no message of %d bytes", size)
	return testpeer.Message{}
}

// A payload inside -max-message that the server's max_payload cannot hold
// once the fabric's headers are added is refused as message_too_large, not
// answered 503 for ever (issue 17 item 6); the largest payload that fits is
// queued.
func TestPayloadBeyondTheServerMaxPayloadIs413(t *testing.T) {
	t.Parallel()
	e, w, g := hostedGroup(t)
	tok := token(t, testTenant, auth.ScopeIngest)
	fit := int(e.nc.MaxPayload()) - payloadHeadroom
	if fit >= DefaultMaxMessageBytes {
		t.Fatalf("server max_payload %d leaves nothing to test", e.nc.MaxPayload())
	}
	post := func(m testpeer.Message) (int, []byte) {
		status, b, _ := w.post(t, testTenant, tok, httpapi.ContentTypeMsgpack, msgpackBody(t, map[string]any{"v": 1, "group": g.ID(), "kind": "mls", "payload": m.MLS}))
		return status, b
	}
	status, b := post(sizedText(t, g, DefaultMaxMessageBytes-40))
	wantError(t, status, b, http.StatusRequestEntityTooLarge, ErrMessageTooLarge.Code, "message.payload")
	m := sizedText(t, g, fit)
	if status, b = post(m); status != http.StatusOK {
		t.Fatalf("a payload of %d bytes: status %d: %s", fit, status, b)
	}
	var r Response
	if err := decodeMsgpack(b, &r); err != nil || len(r.Results) != 1 {
		t.Fatalf("reply %v: %s", err, b)
	}
	wantResult(t, r.Results[0], nil, schema.StatusQueued, "")
}
