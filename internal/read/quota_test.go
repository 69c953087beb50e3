package read_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/clientapi"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/internal/demo"
	"github.com/fabric-mls/fabric/internal/read"
	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// getRaw reads path of clientID as tenant with token; it returns the
// status, Retry-After and the body.
func getRaw(t *testing.T, base, tenant, clientID, token, path string) (int, string, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/tenants/"+tenant+"/clients/"+clientID+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Retry-After"), b
}

// sendTexts has bob send a text of each length and waits until the
// hosted client received them all.
func sendTexts(t *testing.T, fx *fixture, ch <-chan schema.ClientEvent, b *testpeer.Group, lengths ...int) {
	t.Helper()
	for i, n := range lengths {
		m, err := b.SendText(fmt.Sprintf("%03d", i) + strings.Repeat("x", n-3))
		if err != nil {
			t.Fatal(err)
		}
		fx.post(t, m)
	}
	for range lengths {
		await(t, ch, schema.KindMessageReceived)
	}
}

// Issue 27: a page of large messages ends before the message that would
// take it past the page's byte bound, with a cursor from which the next
// page goes on; a message larger than the bound is a page of its own; the
// pages together are every message once, in order.
func TestReadPageEndsAtItsByteBound(t *testing.T) {
	t.Parallel()
	const bound = 64 << 10
	fx := startWith(t, allinone.Options{Quotas: clientapi.Quotas{Read: read.Quotas{PageBytes: bound, ByteRate: -1}}})
	ch := fx.collect(t)
	_, a, b := joinedGroup(t, fx, ch, components.Set{})
	const small, large = 20 << 10, 100 << 10
	lengths := []int{small, small, small, small, small, small, small, large, small, small}
	sendTexts(t, fx, ch, b, lengths...)

	var got []int
	var pages []int // messages per page
	cursor := ""
	for range len(lengths) + 1 {
		path := "/conversations/" + hex.EncodeToString(a.ID()) + "/messages?limit=500"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		status, _, body := getRaw(t, fx.f.URL, allinone.DevTenant, fx.hosted.ClientID, fx.token, path)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
		var page schema.MessagePage
		if err := json.Unmarshal(body, &page); err != nil {
			t.Fatal(err)
		}
		// The bound counts the messages; the page's own members add
		// some bytes.
		if len(page.Messages) > 1 && len(body) > bound+256 {
			t.Errorf("a page of %d messages has %d bytes, over the bound of %d", len(page.Messages), len(body), bound)
		}
		for _, m := range page.Messages {
			if m.Content == nil || m.Content.Text == nil {
				t.Fatalf("message %d without its text", m.DeliveryNumber)
			}
			i, _ := strconv.Atoi((*m.Content.Text)[:3])
			if len(*m.Content.Text) != lengths[i] {
				t.Errorf("message %d: %d bytes of text, want %d", i, len(*m.Content.Text), lengths[i])
			}
			if len(*m.Content.Text) == large && len(page.Messages) != 1 {
				t.Errorf("the message larger than the bound shares a page of %d", len(page.Messages))
			}
			got = append(got, i)
		}
		pages = append(pages, len(page.Messages))
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	for i := range lengths {
		if i >= len(got) || got[i] != i {
			t.Fatalf("pages gave messages %v, want each of %d once in order", got, len(lengths))
		}
	}
	if len(got) != len(lengths) {
		t.Fatalf("pages gave messages %v", got)
	}
	// Three 20 KiB texts fit 64 KiB, a fourth not.
	if want := []int{3, 3, 1, 1, 2}; fmt.Sprint(pages) != fmt.Sprint(want) {
		t.Errorf("messages per page %v, want %v", pages, want)
	}
}

// Issue 27: a tenant past its read quotas gets 429 with Retry-After —
// byte_rate_limited once its answers spent its answer bytes,
// rate_limited past its request rate — while another tenant reads; the
// refusals are counted in fabric_read_quota_refusals_total{code}.
func TestTenantOverReadQuotaGets429WhileAnotherReads(t *testing.T) {
	t.Parallel()
	fx := startWith(t, allinone.Options{Quotas: clientapi.Quotas{Read: read.Quotas{Rate: 0.01, Burst: 2, ByteRate: 0.01, PageBytes: 1000}}})
	ch := fx.collect(t)
	_, a, b := joinedGroup(t, fx, ch, components.Set{})
	sendTexts(t, fx, ch, b, 2000)
	msgs := "/conversations/" + hex.EncodeToString(a.ID()) + "/messages"
	// The first answer is over the byte burst (1000): the tenant owes.
	if status, _, body := getRaw(t, fx.f.URL, allinone.DevTenant, fx.hosted.ClientID, fx.token, msgs); status != http.StatusOK {
		t.Fatalf("first read: %d %s", status, body)
	}
	status, retry, body := getRaw(t, fx.f.URL, allinone.DevTenant, fx.hosted.ClientID, fx.token, "/conversations")
	if status != http.StatusTooManyRequests || !strings.Contains(string(body), `"code":"byte_rate_limited"`) || retry == "" {
		t.Fatalf("read in debt: %d Retry-After %q %s, want 429 byte_rate_limited", status, retry, body)
	}

	// Another tenant, with a client of its own.
	ctx := context.Background()
	tok := func(s auth.Scope) string {
		v, err := auth.Mint(fx.jwtSecret, auth.Claims{Tenant: "other", Scopes: []auth.Scope{s}, Clients: []string{auth.AllClients}, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	account := make([]byte, 32)
	_, _ = rand.Read(account)
	other, err := (&demo.API{BaseURL: fx.f.URL, Tenant: "other", AdminToken: tok(auth.ScopeAdmin)}).Register(ctx, hex.EncodeToString(account))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if status, _, body := getRaw(t, fx.f.URL, "other", other.ClientID, tok(auth.ScopeRead), "/conversations"); status != http.StatusOK {
			t.Fatalf("another tenant's read %d: %d %s", i, status, body)
		}
	}
	status, retry, body = getRaw(t, fx.f.URL, "other", other.ClientID, tok(auth.ScopeRead), "/conversations")
	if status != http.StatusTooManyRequests || !strings.Contains(string(body), `"code":"rate_limited"`) || retry == "" {
		t.Fatalf("past the rate: %d Retry-After %q %s, want 429 rate_limited", status, retry, body)
	}
	resp, err := http.Get(fx.f.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`fabric_read_quota_refusals_total{code="byte_rate_limited"} 1`, `fabric_read_quota_refusals_total{code="rate_limited"} 1`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics without %s", want)
		}
	}
}

// Issue 27: the records one tenant's reads hold at once are bounded
// (read.Quotas.InFlightBytes): a page that would hold more ends early
// with its cursor, even below its byte bound, and the next page goes on.
func TestReadPageEndsAtTheTenantsBytesInFlight(t *testing.T) {
	t.Parallel()
	fx := startWith(t, allinone.Options{Quotas: clientapi.Quotas{Read: read.Quotas{InFlightBytes: 30 << 10, ByteRate: -1}}})
	ch := fx.collect(t)
	_, a, b := joinedGroup(t, fx, ch, components.Set{})
	sendTexts(t, fx, ch, b, 20<<10, 20<<10)
	path := "/conversations/" + hex.EncodeToString(a.ID()) + "/messages?limit=500"
	var pages [][]uint64
	for cursor := "first"; cursor != ""; {
		p := path
		if cursor != "first" {
			p += "&cursor=" + cursor
		}
		status, _, body := getRaw(t, fx.f.URL, allinone.DevTenant, fx.hosted.ClientID, fx.token, p)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", p, status, body)
		}
		var page schema.MessagePage
		if err := json.Unmarshal(body, &page); err != nil {
			t.Fatal(err)
		}
		var ns []uint64
		for _, m := range page.Messages {
			ns = append(ns, m.DeliveryNumber)
		}
		pages = append(pages, ns)
		if cursor = page.NextCursor; len(pages) > 3 {
			break
		}
	}
	// Two records of 20 KiB are more than 30 KiB in flight: one a page.
	if fmt.Sprint(pages) != "[[1] [2]]" {
		t.Fatalf("pages %v, want [[1] [2]]", pages)
	}
}
