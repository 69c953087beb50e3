package ingest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/quota"
)

// Request bodies held at once are bounded in bytes: while one body is being
// read, another that would pass the bound is refused with 503 overloaded
// and Retry-After, and admitted once the first is done.
func TestBytesInFlightBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{limits: Limits{MaxBytesInFlight: 1000}})
	w := e.workers[0]
	tok := token(t, testTenant, auth.ScopeIngest)

	pr, pw := io.Pipe()
	// Cleanups run last-registered first: the slow body ends before the
	// server closes, so a failure below cannot hang the server's Close.
	t.Cleanup(func() { pw.CloseWithError(io.ErrUnexpectedEOF) })
	// The server answers 100 Continue on the handler's first read of the
	// body, which comes after its bytes are reserved: once it arrives, the
	// slow request holds its reservation. A request sent before then could
	// take the bytes first and have the slow request refused instead.
	held := make(chan struct{})
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{Got100Continue: func() { close(held) }})
	slow, err := http.NewRequestWithContext(ctx, http.MethodPost, w.http.URL+"/v1/tenants/"+testTenant+"/transport", pr)
	if err != nil {
		t.Fatal(err)
	}
	slow.ContentLength = 800
	slow.Header.Set("Authorization", "Bearer "+tok)
	slow.Header.Set("Expect", "100-continue")
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ExpectContinueTimeout = time.Minute
	t.Cleanup(tr.CloseIdleConnections)
	done := make(chan int, 1)
	go func() {
		resp, err := (&http.Client{Transport: tr}).Do(slow)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case <-held:
	case status := <-done:
		t.Fatalf("the slow request ended before its body was read: %d", status)
	case <-time.After(30 * time.Second):
		t.Fatal("the slow request's body was never read")
	}

	body := []byte(`{"v":1,"group":"00","kind":"mls","payload":"` + strings.Repeat("00", 120) + `"}`)
	status, b, hdr := w.post(t, testTenant, tok, "", body)
	wantError(t, status, b, http.StatusServiceUnavailable, ErrOverloaded.Code, "")
	if hdr.Get("Retry-After") == "" {
		t.Error("503 overloaded without Retry-After")
	}
	pad := `{"v":1,"group":"00","kind":"mls","payload":"00"}`
	if _, err := io.WriteString(pw, pad+strings.Repeat(" ", 800-len(pad))); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if status := <-done; status != http.StatusOK {
		t.Fatalf("the slow request: %d", status)
	}
	if status, b, _ := w.post(t, testTenant, tok, "", body); status != http.StatusOK {
		t.Fatalf("after the slow request: %d %s", status, b)
	}
}

// A tenant's payload bytes are rate limited apart from its message count:
// past its byte rate it gets 429 byte_rate_limited with Retry-After, and
// another tenant is not affected.
func TestTenantByteRate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{limits: Limits{MaxBodyBytes: 16 << 10, ByteRatePerTenant: 1}})
	w := e.workers[0]
	// 7000 bytes, 14000 in hex: two fit the burst of 16 KiB, a third not.
	body, _ := json.Marshal(wire{V: 1, Group: []byte{0}, Kind: "mls", Payload: make([]byte, 7000)})
	tok := token(t, testTenant, auth.ScopeIngest)
	for i := range 2 {
		if status, b, _ := w.post(t, testTenant, tok, "", body); status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, status, b)
		}
	}
	status, b, hdr := w.post(t, testTenant, tok, "", body)
	wantError(t, status, b, http.StatusTooManyRequests, ErrByteRateLimited.Code, "bytes")
	if hdr.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	if status, b, _ := w.post(t, "other", token(t, "other", auth.ScopeIngest), "", body); status != http.StatusOK {
		t.Fatalf("another tenant: %d %s", status, b)
	}
}

// A full FABRIC_IN refuses input with 507 storage_full, not the 503 that
// asks for a retry, and acknowledges nothing.
func TestFullInputStreamIsStorageFull(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{inBytes: 8 << 10})
	w := e.workers[0]
	g := newGroup(t)
	e.hostGroup(g.ID())
	tok := token(t, testTenant, auth.ScopeIngest)
	for i := range 200 {
		m := text(t, g, strings.Repeat("x", 400))
		body, _ := json.Marshal(wire{V: 1, Group: g.ID(), Kind: "mls", Payload: m.MLS})
		status, b, _ := w.post(t, testTenant, tok, "", body)
		if status == http.StatusOK {
			continue
		}
		wantError(t, status, b, http.StatusInsufficientStorage, ErrStorageFull.Code, "")
		if _, found := w.outcome(t, m.ID); found {
			t.Error("a refused input has an outcome")
		}
		if i == 0 {
			t.Fatal("the first input was refused")
		}
		return
	}
	t.Fatal("FABRIC_IN took 200 inputs past its bound of 8 KiB")
}

// Issue 27: a tenant's input stored on FABRIC_IN within its retention is
// bounded (Config.InputBytes): past it the tenant gets 429
// input_quota_exceeded with Retry-After, never a 5xx, nothing of the
// refused request is stored, and another tenant's input is taken.
func TestTenantInputBytesRefusedPastTheBound(t *testing.T) {
	t.Parallel()
	const bound = 8 << 10
	e := newEnv(t, envOpts{tenantIn: quota.NewTally(bound, time.Hour)})
	w := e.workers[0]
	g := newGroup(t)
	e.hostGroup(g.ID())
	tok := token(t, testTenant, auth.ScopeIngest)
	stored := 0
	for i := range 20 {
		m := text(t, g, strings.Repeat("x", 1000))
		body, _ := json.Marshal(wire{V: 1, Group: g.ID(), Kind: "mls", Payload: m.MLS})
		status, b, hdr := w.post(t, testTenant, tok, "", body)
		if status == http.StatusOK {
			stored += len(m.MLS)
			continue
		}
		wantError(t, status, b, http.StatusTooManyRequests, ErrInputQuota.Code, "")
		if hdr.Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
		if _, found := w.outcome(t, m.ID); found {
			t.Error("a refused input has an outcome")
		}
		if i == 0 || stored > bound {
			t.Fatalf("refused after %d inputs, %d bytes, bound %d", i, stored, bound)
		}
		other := newGroup(t)
		body, _ = json.Marshal(wire{V: 1, Group: other.ID(), Kind: "mls", Payload: text(t, other, strings.Repeat("y", 1000)).MLS})
		if status, b, _ := w.post(t, "other", token(t, "other", auth.ScopeIngest), "", body); status != http.StatusOK {
			t.Fatalf("another tenant: %d %s", status, b)
		}
		return
	}
	t.Fatalf("a tenant stored %d bytes past its bound of %d", stored, bound)
}
