package clientstore

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// inboxIDLen is the length of an inbox id: lowercase hex of 32 bytes.
const inboxIDLen = 64

// ConsentRecord is a consent record's entity and stored state, the body of
// PUT …/consent and of the answers about it.
type ConsentRecord struct {
	EntityKind schema.ConsentEntityKind `json:"entity_kind" msgpack:"entity_kind"`
	// Entity is encoded as CONS-002 says (EVENT-009): the group id in
	// lowercase hex for a conversation, the inbox id for an inbox.
	Entity string              `json:"entity" msgpack:"entity"`
	State  schema.ConsentState `json:"state" msgpack:"state"`
}

// consentAnswer is the answer to PUT …/consent.
type consentAnswer struct {
	ConsentRecord
	// Changed is whether the stored state changed, and so whether
	// consent.changed was emitted.
	Changed bool `json:"changed" msgpack:"changed"`
}

// consentState is what fabric-stores holds for one consent record.
type consentState struct {
	State schema.ConsentState `msgpack:"state"`
	// Version counts the stored changes; it makes each change's event id.
	Version uint64 `msgpack:"version"`
}

// checkEntity checks a consent entity's encoding (CONS-002, EVENT-009).
func checkEntity(kind schema.ConsentEntityKind, entity string) error {
	switch kind {
	case schema.ConsentEntityConversation:
		if subject.ValidGroup(entity) != nil {
			return refusal.BadRequest("entity: a conversation is named by its group id in lowercase hex (at most %d digits)", subject.MaxGroupHexLen)
		}
	case schema.ConsentEntityInbox:
		if !isInboxID(entity) {
			return refusal.BadRequest("entity: an inbox is named by its inbox id, %d lowercase hex digits", inboxIDLen)
		}
	default:
		return refusal.BadRequest("entity_kind: want conversation or inbox")
	}
	return nil
}

func isInboxID(s string) bool {
	return len(s) == inboxIDLen && subject.ValidClient(s) == nil
}

func consentKey(tenant, clientID string, kind schema.ConsentEntityKind, entity string) (string, error) {
	return subject.Key(tenant, clientID, "consent", string(kind), entity)
}

func (s *Store) putConsent(r *http.Request, c call) (int, any, error) {
	var req ConsentRecord
	if err := httpapi.Decode(r, maxBody, &req); err != nil {
		return 0, nil, err
	}
	if err := checkEntity(req.EntityKind, req.Entity); err != nil {
		return 0, nil, err
	}
	if !req.State.Valid() {
		return 0, nil, refusal.BadRequest("state: want unknown, allowed or denied")
	}
	changed, err := s.SetConsent(r.Context(), c.tenant, c.client.ClientID, req)
	if err != nil {
		return 0, nil, emitError(err)
	}
	return http.StatusOK, consentAnswer{ConsentRecord: req, Changed: changed}, nil
}

// SetConsent stores a consent record's state for a client and emits
// consent.changed when the stored state changes; storing the state it
// already has changes nothing and emits nothing. A record never stored has
// state unknown. The record's key serializes writers, so the events of one
// entity are emitted in the order of its changes (EVENT-012).
func (s *Store) SetConsent(ctx context.Context, tenant, clientID string, rec ConsentRecord) (changed bool, err error) {
	key, err := consentKey(tenant, clientID, rec.EntityKind, rec.Entity)
	if err != nil {
		return false, fmt.Errorf("clientstore: consent key: %w", err)
	}
	_, events, err := outbox.Apply(ctx, s.out, key, func(cur consentState, found bool) (outbox.Change[consentState], error) {
		if !found {
			cur.State = schema.ConsentUnknown
		}
		if cur.State == rec.State {
			return outbox.Change[consentState]{State: cur}, nil
		}
		next := consentState{State: rec.State, Version: cur.Version + 1}
		ev := outbox.Event{
			Tenant:   tenant,
			ClientID: clientID,
			ID:       eventID(tenant, clientID, "consent", string(rec.EntityKind), rec.Entity, strconv.FormatUint(next.Version, 10)),
			Event: schema.ClientEvent{
				Kind: schema.KindConsentChanged,
				ConsentChanged: &schema.ConsentChanged{ // EVENT-009
					EntityKind: rec.EntityKind,
					Entity:     rec.Entity,
					State:      rec.State,
				},
			},
		}
		return outbox.Change[consentState]{State: next, Store: true, Events: []outbox.Event{ev}}, nil
	})
	return len(events) > 0, err
}

func (s *Store) getConsent(r *http.Request, c call) (int, any, error) {
	rec := ConsentRecord{EntityKind: schema.ConsentEntityKind(r.PathValue("entity_kind")), Entity: r.PathValue("entity")}
	if err := checkEntity(rec.EntityKind, rec.Entity); err != nil {
		return 0, nil, err
	}
	key, err := consentKey(c.tenant, c.client.ClientID, rec.EntityKind, rec.Entity)
	if err != nil {
		return 0, nil, err
	}
	st, found, err := outbox.Get[consentState](r.Context(), s.out, key)
	if err != nil {
		return 0, nil, err
	}
	rec.State = schema.ConsentUnknown
	if found {
		rec.State = st.State
	}
	return http.StatusOK, rec, nil
}
