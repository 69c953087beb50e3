package read

import (
	"net/http"

	"github.com/fabric-mls/fabric/pkg/schema"
)

func (a *API) listConsent(r *http.Request, c call) (any, error) {
	p, err := pageOf(r)
	if err != nil {
		return nil, err
	}
	recs, next, err := a.cfg.Stores.ListConsent(r.Context(), c.tenant, c.client, p.cursor, p.limit)
	if err != nil {
		return nil, err
	}
	out := schema.ConsentPage{Consent: []schema.ConsentRecord{}, NextCursor: cursorString(next)}
	for _, rec := range recs {
		out.Consent = append(out.Consent, schema.ConsentRecord{EntityKind: rec.EntityKind, Entity: rec.Entity, State: rec.State})
	}
	return out, nil
}

func (a *API) listIdentities(r *http.Request, c call) (any, error) {
	p, err := pageOf(r)
	if err != nil {
		return nil, err
	}
	recs, next, err := a.cfg.Stores.ListIdentities(r.Context(), c.tenant, c.client, p.cursor, p.limit)
	if err != nil {
		return nil, err
	}
	out := schema.IdentityPage{Identities: []schema.HeldIdentity{}, NextCursor: cursorString(next)}
	for _, h := range recs {
		out.Identities = append(out.Identities, schema.HeldIdentity{InboxID: h.InboxID, Held: schema.Association{
			SequenceID: h.Held.SequenceID, InstallationKeys: h.Held.InstallationKeys, DisplayHandle: h.Held.DisplayHandle,
		}})
	}
	return out, nil
}
