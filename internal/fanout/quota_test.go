package fanout

import (
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

// dialStatus opens a WebSocket for tok and returns the HTTP status and body
// of a refused upgrade, or 101 and closes it.
func (e *env) dialStatus(tok string) (int, string) {
	e.t.Helper()
	ws, resp, err := websocket.Dial(e.ctx, e.wsURL(), &websocket.DialOptions{
		HTTPHeader:   map[string][]string{"Authorization": {"Bearer " + tok}},
		Subprotocols: []string{wire.SubprotocolJSON},
	})
	if err == nil {
		_ = ws.CloseNow()
		return http.StatusSwitchingProtocols, ""
	}
	if resp == nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	buf := make([]byte, 512)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	return resp.StatusCode, b.String()
}

// One tenant cannot hold more event connections than its quota; the refusal
// is a 429 with its code and counted, other tenants are not affected, and a
// closed connection frees its place.
func TestTenantConnectionQuota(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxConnsPerTenant = 2 })
	tok := token(t, "t1", "c1")
	first, _ := e.raw(tok), e.raw(tok)
	if code, body := e.dialStatus(tok); code != http.StatusTooManyRequests || !strings.Contains(body, CodeTooManyConnections) {
		t.Fatalf("third connection of a tenant with a quota of 2: %d %q", code, body)
	}
	if code := sseStatus(t, e, "/v1/tenants/t1/clients/c1/events?kinds=message.received", tok); code != http.StatusTooManyRequests {
		t.Errorf("SSE past the quota: %d", code)
	}
	if code, _ := e.dialStatus(token(t, "t2", "c1")); code != http.StatusSwitchingProtocols {
		t.Errorf("another tenant refused: %d", code)
	}
	if got := testutil.ToFloat64(e.g.metrics.refusals.WithLabelValues(CodeTooManyConnections)); got != 2 {
		t.Errorf("refusals counted %v, want 2", got)
	}
	_ = first.ws.Close(websocket.StatusNormalClosure, "")
	eventually.True(t, "a closed connection frees its place", func() bool {
		code, _ := e.dialStatus(tok)
		return code == http.StatusSwitchingProtocols
	})
}

// A resuming subscription reads at most MaxReplay stored events and hands
// off lagged for the rest (EVENT-031); a tenant whose replay budget is
// spent is refused further resumes with a code, but may still subscribe
// from now.
func TestReplayBudget(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxReplay, c.ReplayRate, c.ReplayBurst = 5, 1e-6, 8 })
	var first uint64
	for i := range 20 {
		seq := e.publish("t1", "c1", published{ev: received(groupA, i, &text)})
		if i == 0 {
			first = seq
		}
	}
	r := e.raw(token(t, "t1", "c1"))
	all := schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}}
	resume := func(id uint64) wire.Frame {
		r.send(wire.Frame{Op: wire.OpSubscribe, ID: id, ClientID: "c1", Filter: &all, AfterSeq: first})
		return r.read()
	}
	if f := resume(1); f.Op != wire.OpSubscribed {
		t.Fatalf("first resume: %+v", f)
	}
	for want := 1; want <= 5; want++ {
		f := r.read()
		if ev := decodeJSONEvent(t, f.Event); f.Op != wire.OpEvent || msgNo(ev) != want {
			t.Fatalf("replayed event %d: %+v", want, f)
		}
	}
	if f := r.read(); decodeJSONEvent(t, f.Event).Kind != schema.KindLagged {
		t.Fatalf("after MaxReplay events: want lagged, got %+v", f)
	}
	// 5 of 8 spent: one more resume is allowed and overdraws the budget.
	if f := resume(2); f.Op != wire.OpSubscribed {
		t.Fatalf("second resume: %+v", f)
	}
	for range 6 {
		r.read()
	}
	if f := resume(3); f.Op != wire.OpError || f.ID != 3 || f.Code != CodeReplayBudget {
		t.Fatalf("resume past the budget: %+v", f)
	}
	if got := testutil.ToFloat64(e.g.metrics.refusals.WithLabelValues(CodeReplayBudget)); got != 1 {
		t.Errorf("refusals counted %v, want 1", got)
	}
	r.subscribe(4, "c1", all)
}
