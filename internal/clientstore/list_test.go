package clientstore

import (
	"context"
	"net/http"
	"slices"
	"testing"
)

// An operator (the console) lists a tenant's hosted clients page by page:
// every client once, none of another tenant, no index or tenant entries of
// the bucket (KeyPackage refs, credentials, the content key), and with the
// admin scope only.
func TestListClientsPagesATenantsHostedClients(t *testing.T) {
	e := newEnv(t)
	s, srv := e.store()
	const other = "globex"
	var want []string
	kps := 2
	for i := range 5 {
		ci := register(t, srv, tenant, RegisterRequest{InboxID: inboxOf(byte(10 + i)), KeyPackages: &kps})
		want = append(want, ci.ClientID)
	}
	register(t, srv, other, RegisterRequest{InboxID: inboxOf(99)})
	// A tenant-level entry beside the records, as the tenant's content key.
	if _, err := s.Clients().Put(context.Background(), tenant+".content-key", make([]byte, 32)); err != nil {
		t.Fatal(err)
	}

	var got []string
	url := srv.URL + "/v1/tenants/" + tenant + "/clients?limit=2"
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatalf("no end after %d pages: %v", pages, got)
		}
		var p ClientsPage
		if status, raw := do(t, http.MethodGet, url, adminToken(t, tenant), nil, &p); status != http.StatusOK {
			t.Fatalf("list: %d %s", status, raw)
		}
		if len(p.Clients) > 2 {
			t.Fatalf("page of %d, limit 2", len(p.Clients))
		}
		for _, c := range p.Clients {
			if c.InboxID == "" || len(c.KeyPackages) != 0 {
				t.Fatalf("listed %+v", c)
			}
			got = append(got, c.ClientID)
		}
		if p.NextCursor == "" {
			break
		}
		url = srv.URL + "/v1/tenants/" + tenant + "/clients?limit=2&cursor=" + p.NextCursor
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}

	list := srv.URL + "/v1/tenants/" + tenant + "/clients"
	if status, _ := do(t, http.MethodGet, list, adminToken(t, other), nil, nil); status != http.StatusForbidden {
		t.Fatalf("another tenant's token: %d", status)
	}
	if status, _ := do(t, http.MethodGet, list+"?cursor=x", adminToken(t, tenant), nil, nil); status != http.StatusBadRequest {
		t.Fatalf("bad cursor: %d", status)
	}
}
