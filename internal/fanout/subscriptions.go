package fanout

import (
	"cmp"
	"net/http"
	"slices"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/httpapi"
)

// SubscriptionInfo is one live subscription of this gateway, as the
// operator's console shows it: where its queue stands against the bound
// (EVENT-030) and what it lost (EVENT-031).
type SubscriptionInfo struct {
	ClientID  string `json:"client_id" msgpack:"client_id"`
	Transport string `json:"transport" msgpack:"transport"` // websocket or sse
	// Queued events wait here; Held counts them and those sent and not yet
	// credited, against Capacity.
	Queued   int `json:"queued" msgpack:"queued"`
	Held     int `json:"held" msgpack:"held"`
	Capacity int `json:"capacity" msgpack:"capacity"`
	// Lagged counts the lagged events handed off, Discarded the events
	// they reported.
	Lagged    uint64 `json:"lagged" msgpack:"lagged"`
	Discarded uint64 `json:"discarded" msgpack:"discarded"`
}

// SubscriptionList is the answer of GET subscriptions.
type SubscriptionList struct {
	Subscriptions []SubscriptionInfo `json:"subscriptions" msgpack:"subscriptions"`
}

// serveSubscriptions serves GET /v1/tenants/{tenant}/subscriptions: the
// tenant's live subscriptions on this gateway (admin scope).
func (g *Gateway) serveSubscriptions(w http.ResponseWriter, r *http.Request) {
	tenant := r.PathValue("tenant")
	claims, err := g.cfg.Verifier.FromRequest(r)
	if err == nil {
		err = claims.Require(auth.ScopeAdmin, tenant, "")
	}
	if err != nil {
		httpapi.WriteError(w, r, err)
		return
	}
	g.connsMu.Lock()
	conns := make([]*conn, 0, len(g.conns))
	for c := range g.conns {
		if c.claims.Tenant == tenant {
			conns = append(conns, c)
		}
	}
	g.connsMu.Unlock()
	out := SubscriptionList{Subscriptions: []SubscriptionInfo{}}
	for _, c := range conns {
		c.mu.Lock()
		for _, s := range c.subs {
			out.Subscriptions = append(out.Subscriptions, SubscriptionInfo{
				ClientID: s.client, Transport: c.transport(),
				Queued: s.q.Len(), Held: s.q.Held(), Capacity: s.q.Capacity(),
				Lagged: s.q.TotalLagged(), Discarded: s.q.TotalDiscarded(),
			})
		}
		c.mu.Unlock()
	}
	slices.SortFunc(out.Subscriptions, func(a, b SubscriptionInfo) int { return cmp.Compare(a.ClientID, b.ClientID) })
	httpapi.Write(w, r, http.StatusOK, out)
}
