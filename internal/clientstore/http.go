package clientstore

import (
	"errors"
	"net/http"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
)

// maxBody bounds every request body of the store.
const maxBody = 64 << 10

// call is one authorized request: its tenant and, below a client, the
// client's record.
type call struct {
	tenant string
	client *Record // nil for tenant-level endpoints
}

// endpoint answers a call with a status and a body, or an error.
type endpoint func(r *http.Request, c call) (int, any, error)

// handle authorizes a request (admin scope, the path's tenant and client),
// loads the client a path names, and writes the endpoint's answer.
func (s *Store) handle(ep endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		status, body, err := s.serve(r, ep)
		if err != nil {
			s.metrics.refusals.WithLabelValues(refusal.Code(err)).Inc()
			httpapi.WriteError(w, r, err)
			return
		}
		httpapi.Write(w, r, status, body)
	}
}

func (s *Store) serve(r *http.Request, ep endpoint) (int, any, error) {
	c, err := Authorize(r, s.verify, auth.ScopeAdmin)
	if err != nil {
		return 0, nil, err
	}
	if id := r.PathValue("client_id"); id != "" {
		rec, err := s.Lookup(r.Context(), c.Tenant, id)
		if err != nil {
			return 0, nil, notFoundOr(err)
		}
		// Completes a registration a crash or an outage interrupted after
		// the record was stored: identity.registered comes before any
		// other event of the stores for this client.
		if err := s.registered(r.Context(), rec); err != nil {
			return 0, nil, emitError(err)
		}
		return ep(r, call{tenant: c.Tenant, client: &rec})
	}
	return ep(r, call{tenant: c.Tenant})
}

// Target is what an authorized request is about.
type Target struct {
	Tenant   string
	ClientID string // "" for a tenant-level path
}

// Authorize checks the request's bearer token for scope on the path's
// {tenant} and, when the path has one, {client_id}, and checks both ids'
// form. Errors are auth's refusals or refusal.ErrBadRequest.
func Authorize(r *http.Request, v *auth.Verifier, scope auth.Scope) (Target, error) {
	claims, err := v.FromRequest(r)
	if err != nil {
		return Target{}, err
	}
	t := Target{Tenant: r.PathValue("tenant"), ClientID: r.PathValue("client_id")}
	if err := claims.Require(scope, t.Tenant, t.ClientID); err != nil {
		return Target{}, err
	}
	if err := subject.ValidTenant(t.Tenant); err != nil {
		return Target{}, refusal.BadRequest("%v", err)
	}
	if t.ClientID != "" {
		if err := subject.ValidClient(t.ClientID); err != nil {
			return Target{}, refusal.BadRequest("%v", err)
		}
	}
	return t, nil
}

// notFoundOr maps ErrNotFound to ErrUnknownClient and passes other errors on.
func notFoundOr(err error) error {
	if errors.Is(err, ErrNotFound) {
		return ErrUnknownClient
	}
	return err
}

// emitError maps an outbox failure to an answer: the change is stored and
// its events follow with the next change of the same record, or a retry of
// this request.
func emitError(err error) error {
	switch {
	case errors.Is(err, outbox.ErrEmit):
		return ErrEmitPending
	case errors.Is(err, outbox.ErrContention):
		return ErrContention
	}
	return err
}
