package clientstore

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Bounds of an association state.
const (
	maxInstallationKeys = 1024
	maxDisplayHandle    = 256
)

// AssociationState is an inbox's identity association state (IDENT): its
// sequence id, its installation keys, and its display handle if it has one.
// It is the body of PUT …/identities/{inbox_id}.
type AssociationState struct {
	SequenceID       uint64         `json:"sequence_id" msgpack:"sequence_id"`
	InstallationKeys []schema.Bytes `json:"installation_keys" msgpack:"installation_keys"`
	DisplayHandle    *string        `json:"display_handle,omitempty" msgpack:"display_handle,omitempty"`
}

// AssociationAnswer is the answer to PUT …/identities/{inbox_id}: the state
// held with the greatest sequence id after the call, and whether this call
// stored the given state as that.
type AssociationAnswer struct {
	InboxID string           `json:"inbox_id" msgpack:"inbox_id"`
	Held    AssociationState `json:"held" msgpack:"held"`
	Stored  bool             `json:"stored" msgpack:"stored"`
}

func (a AssociationState) check() error {
	if a.InstallationKeys == nil {
		return refusal.BadRequest("installation_keys: required (an empty list is [])")
	}
	if len(a.InstallationKeys) > maxInstallationKeys {
		return refusal.BadRequest("installation_keys: more than %d", maxInstallationKeys)
	}
	for i, k := range a.InstallationKeys {
		if len(k) != schema.InstallationKeySize {
			return refusal.BadRequest("installation_keys: entry %d is not %d bytes", i, schema.InstallationKeySize)
		}
		for _, o := range a.InstallationKeys[:i] {
			if bytes.Equal(k, o) {
				return refusal.BadRequest("installation_keys: entry %d repeats an earlier key", i)
			}
		}
	}
	if h := a.DisplayHandle; h != nil && (*h == "" || len(*h) > maxDisplayHandle || !utf8.ValidString(*h)) {
		return refusal.BadRequest("display_handle: want 1 to %d bytes of UTF-8 when present", maxDisplayHandle)
	}
	return nil
}

// equal reports whether a and b are the same state.
func (a AssociationState) equal(b AssociationState) bool {
	if a.SequenceID != b.SequenceID || !slices.EqualFunc(a.InstallationKeys, b.InstallationKeys, schema.Bytes.Equal) {
		return false
	}
	return (a.DisplayHandle == nil) == (b.DisplayHandle == nil) && (a.DisplayHandle == nil || *a.DisplayHandle == *b.DisplayHandle)
}

func identityKey(tenant, clientID, inboxID string) (string, error) {
	return subject.Key(tenant, clientID, "identity", inboxID)
}

func (s *Store) putIdentity(r *http.Request, c call) (int, any, error) {
	inbox := r.PathValue("inbox_id")
	if !isInboxID(inbox) {
		return 0, nil, refusal.BadRequest("inbox_id: want %d lowercase hex digits", inboxIDLen)
	}
	var req AssociationState
	if err := httpapi.Decode(r, maxBody, &req); err != nil {
		return 0, nil, err
	}
	if err := req.check(); err != nil {
		return 0, nil, err
	}
	held, stored, err := s.StoreAssociation(r.Context(), *c.client, inbox, req)
	if err != nil {
		return 0, nil, emitError(err)
	}
	return http.StatusOK, AssociationAnswer{InboxID: inbox, Held: held, Stored: stored}, nil
}

// StoreAssociation stores an association state of inbox for client. The
// client holds, per inbox, the state with the greatest sequence id; a state
// at a lower sequence id changes nothing, and a different state at the held
// sequence id is a conflict. Storing a greater state emits, in kind-table
// order (EVENT-012):
//   - for the own inbox, identity.own_installation_added for each key the
//     state adds and identity.own_installation_revoked for each key it
//     removes, with is_this_installation (EVENT-024);
//   - handle.changed when the state has a display handle and the held one
//     has none or another (EVENT-058).
//
// The first state held for an inbox emits nothing: it changes nothing the
// client knew (EVENT-058).
func (s *Store) StoreAssociation(ctx context.Context, client Record, inbox string, st AssociationState) (held AssociationState, stored bool, err error) {
	key, err := identityKey(client.Tenant, client.ClientID, inbox)
	if err != nil {
		return AssociationState{}, false, fmt.Errorf("clientstore: identity key: %w", err)
	}
	var conflict bool
	held, _, err = outbox.Apply(ctx, s.out, key, func(cur AssociationState, found bool) (outbox.Change[AssociationState], error) {
		conflict, stored = false, false
		switch {
		case !found:
			stored = true
			return outbox.Change[AssociationState]{State: st, Store: true}, nil
		case st.SequenceID < cur.SequenceID:
			return outbox.Change[AssociationState]{State: cur}, nil
		case st.SequenceID == cur.SequenceID:
			conflict = !st.equal(cur)
			return outbox.Change[AssociationState]{State: cur}, nil
		}
		stored = true
		return outbox.Change[AssociationState]{State: st, Store: true, Events: associationEvents(client, inbox, cur, st)}, nil
	})
	if err != nil {
		return held, stored, err
	}
	if conflict {
		return held, false, ErrSequenceConflict
	}
	return held, stored, nil
}

// associationEvents are the events of replacing held by next, a state with
// a greater sequence id.
func associationEvents(client Record, inbox string, held, next AssociationState) []outbox.Event {
	var evs []outbox.Event
	seq := strconv.FormatUint(next.SequenceID, 10)
	ev := func(kind schema.EventKind, part string, e schema.ClientEvent) {
		e.Kind = kind
		evs = append(evs, outbox.Event{
			Tenant:   client.Tenant,
			ClientID: client.ClientID,
			ID:       eventID(client.Tenant, client.ClientID, "identity", inbox, seq, string(kind), part),
			Event:    e,
		})
	}
	if inbox == client.InboxID {
		for _, k := range next.InstallationKeys {
			if !slices.ContainsFunc(held.InstallationKeys, k.Equal) {
				ev(schema.KindOwnInstallationAdded, hex.EncodeToString(k), schema.ClientEvent{
					OwnInstallationAdded: &schema.InstallationRef{InstallationKey: k},
				})
			}
		}
		for _, k := range held.InstallationKeys {
			if !slices.ContainsFunc(next.InstallationKeys, k.Equal) {
				ev(schema.KindOwnInstallationRevoked, hex.EncodeToString(k), schema.ClientEvent{
					OwnInstallationRevoked: &schema.InstallationRevoked{
						InstallationKey:    k,
						IsThisInstallation: bytes.Equal(k, client.InstallationKey),
					},
				})
			}
		}
	}
	if h := next.DisplayHandle; h != nil && (held.DisplayHandle == nil || *held.DisplayHandle != *h) {
		ev(schema.KindHandleChanged, "", schema.ClientEvent{
			HandleChanged: &schema.HandleChanged{InboxID: inbox, Handle: *h}, // EVENT-058
		})
	}
	return evs
}

func (s *Store) getIdentity(r *http.Request, c call) (int, any, error) {
	inbox := r.PathValue("inbox_id")
	if !isInboxID(inbox) {
		return 0, nil, refusal.BadRequest("inbox_id: want %d lowercase hex digits", inboxIDLen)
	}
	key, err := identityKey(c.tenant, c.client.ClientID, inbox)
	if err != nil {
		return 0, nil, err
	}
	st, found, err := outbox.Get[AssociationState](r.Context(), s.out, key)
	if err != nil {
		return 0, nil, err
	}
	if !found {
		return 0, nil, ErrNoAssociationState
	}
	return http.StatusOK, st, nil
}
