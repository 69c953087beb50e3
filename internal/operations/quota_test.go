package operations

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/eventually"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/internal/quota"
)

// anyTenant hosts the client of every tenant.
type anyTenant struct{}

func (anyTenant) ClientInbox(_ context.Context, _, c string) (string, error) {
	if c != client {
		return "", clientstore.ErrUnknownClient
	}
	return strings.Repeat("ab", 32), nil
}

// quotaEnv is the API with quotas over HTTP and NATS, for any tenant.
type quotaEnv struct {
	t   *testing.T
	nc  *nats.Conn
	js  jetstream.JetStream
	srv *httptest.Server
	reg *prometheus.Registry
}

func newQuotaEnv(t *testing.T, q Quotas) *quotaEnv {
	t.Helper()
	n := natstest.Start(t)
	verifier, err := auth.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	api := New(Config{JS: n.JS, Verifier: verifier, Clients: anyTenant{}, Quotas: q, Registerer: reg})
	mux := http.NewServeMux()
	api.Mount(mux)
	srv := httptest.NewServer(mux)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := api.Run(ctx); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait(); srv.Close() })
	// The queue subscription is on the server once a request finds it; a
	// request without a token is refused before any quota.
	eventually.NoError(t, func() error {
		_, err := n.Conn.Request(must(subject.OperateRequest("probe", client, VerbOperation)), nil, time.Second)
		return err
	})
	return &quotaEnv{t: t, nc: n.Conn, js: n.JS, srv: srv, reg: reg}
}

// quotaAnswer is one answer and its Retry-After.
type quotaAnswer struct {
	answer
	retryAfter string
}

// create asks for a create_conversation of tenant with key, over HTTP or
// NATS, with body.
func (e *quotaEnv) create(tenant, key string, overNATS bool, body []byte) quotaAnswer {
	e.t.Helper()
	return e.op(tenant, key, overNATS, "", body)
}

// op asks for a create_conversation, or with a group a send_message.
func (e *quotaEnv) op(tenant, key string, overNATS bool, group string, body []byte) quotaAnswer {
	e.t.Helper()
	tok, err := auth.Mint(secret, auth.Claims{Tenant: tenant, Scopes: []auth.Scope{auth.ScopeSend}, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		e.t.Fatal(err)
	}
	if overNATS {
		verb := "create_conversation"
		if group != "" {
			verb = "send_message"
		}
		m := nats.NewMsg(must(subject.OperateRequest(tenant, client, verb)))
		m.Data = body
		if group != "" {
			m.Header.Set(HeaderGroupID, group)
		}
		m.Header.Set("Authorization", "Bearer "+tok)
		m.Header.Set(HeaderIdempotencyKey, key)
		m.Header.Set("Content-Type", "application/json")
		reply, err := e.nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			e.t.Fatal(err)
		}
		status, err := strconv.Atoi(reply.Header.Get(bus.HeaderReplyStatus))
		if err != nil {
			e.t.Fatalf("reply without %s", bus.HeaderReplyStatus)
		}
		return quotaAnswer{answer{status: status, body: reply.Data, code: reply.Header.Get(bus.HeaderReplyError)}, reply.Header.Get("Retry-After")}
	}
	path := "/conversations"
	if group != "" {
		path += "/" + group + "/messages"
	}
	r, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/tenants/"+tenant+"/clients/"+client+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	r.Header.Set("Authorization", "Bearer "+tok)
	r.Header.Set(HeaderIdempotencyKey, key)
	r.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	var refused struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal(b, &refused)
	return quotaAnswer{answer{status: resp.StatusCode, body: b, code: refused.Error.Code}, resp.Header.Get("Retry-After")}
}

// stored is how many messages FABRIC_IN holds.
func (e *quotaEnv) stored() uint64 {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), streams.StreamInput)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

// refusals is fabric_operations_quota_refusals_total{code}; -1 when the
// series is not there.
func (e *quotaEnv) refusals(code string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "fabric_operations_quota_refusals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// Issue 27: a tenant over its operation rate gets 429 rate_limited with
// Retry-After, over HTTP and over NATS (Fabric-Status, Fabric-Error,
// Retry-After), nothing of the refused request is stored, and another
// tenant's operations are accepted meanwhile.
func TestTenantOverOperationQuotaGets429WhileAnotherIsAccepted(t *testing.T) {
	e := newQuotaEnv(t, Quotas{Rate: 0.01, Burst: 2})
	body := []byte(`{"name":"team"}`)
	for i, overNATS := range []bool{false, true} {
		if a := e.create("flood", fmt.Sprint("k", i), overNATS, body); a.status != http.StatusAccepted {
			t.Fatalf("within the burst: %d %s", a.status, a.body)
		}
	}
	before := e.stored()
	for _, overNATS := range []bool{false, true} {
		a := e.create("flood", "past", overNATS, body)
		if a.status != http.StatusTooManyRequests || a.code != quota.ErrRateLimited.Code {
			t.Errorf("past the quota (NATS %v): %d %q %s, want 429 %s", overNATS, a.status, a.code, a.body, quota.ErrRateLimited.Code)
		}
		if secs, err := strconv.Atoi(a.retryAfter); err != nil || secs < 1 {
			t.Errorf("past the quota (NATS %v): Retry-After %q", overNATS, a.retryAfter)
		}
	}
	if after := e.stored(); after != before {
		t.Errorf("refused requests stored %d messages", after-before)
	}
	for i, overNATS := range []bool{false, true} {
		if a := e.create("quiet", fmt.Sprint("k", i), overNATS, body); a.status != http.StatusAccepted {
			t.Errorf("another tenant (NATS %v): %d %s", overNATS, a.status, a.body)
		}
	}
	if n := e.refusals(quota.ErrRateLimited.Code); n != 2 {
		t.Errorf("fabric_operations_quota_refusals_total{code=rate_limited} = %v, want 2", n)
	}
}

// Issue 27: a tenant's operation bytes stored on FABRIC_IN within its
// retention are bounded: past the bound 429 input_quota_exceeded with
// Retry-After, never a 5xx; a repeated Idempotency-Key stores and counts
// nothing new; another tenant is accepted.
func TestOperationsPastTenantInputBytesAreRefused(t *testing.T) {
	const bound = 8 << 10
	e := newQuotaEnv(t, Quotas{ByteRate: -1, InputBytes: quota.NewTally(bound, time.Hour)})
	body := []byte(`{"text":"` + strings.Repeat("n", 1500) + `"}`)
	group := strings.Repeat("0c", 32)
	// Asked twice: the second stores nothing and is not counted.
	for range 2 {
		if a := e.op("flood", "same", false, group, body); a.status != http.StatusAccepted {
			t.Fatalf("first: %d %s", a.status, a.body)
		}
	}
	for i := range 20 {
		a := e.op("flood", fmt.Sprint("k", i), i%2 == 1, group, body)
		if a.status == http.StatusAccepted {
			continue
		}
		if a.status != http.StatusTooManyRequests || a.code != quota.ErrInputQuota.Code || a.retryAfter == "" {
			t.Fatalf("past the bound: %d %q Retry-After %q %s", a.status, a.code, a.retryAfter, a.body)
		}
		// Each operation stores about 1.6 KB: five fit in 8 KiB, with
		// the repeated one counted once.
		if i+1 < 4 || i+1 > 5 {
			t.Errorf("refused after %d operations besides the first", i)
		}
		if a := e.op("quiet", "k", false, group, body); a.status != http.StatusAccepted {
			t.Fatalf("another tenant: %d %s", a.status, a.body)
		}
		return
	}
	t.Fatalf("a tenant stored 21 operations of 1.5 KB past its bound of %d bytes", bound)
}
