package clientstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// HeldIdentity is one inbox's association state a client holds.
type HeldIdentity struct {
	InboxID string           `json:"inbox_id" msgpack:"inbox_id"`
	Held    AssociationState `json:"held" msgpack:"held"`
}

// ListConsent returns up to limit of a client's stored consent records,
// in the order they were last changed, from bucket sequence from on, and
// the sequence the next page starts at (0 when there is no more). A read
// costs what it returns, not what the client stores.
func (s *Store) ListConsent(ctx context.Context, tenant, clientID string, from uint64, limit int) ([]ConsentRecord, uint64, error) {
	var out []ConsentRecord
	next, err := s.list(ctx, tenant, clientID, "consent", from, limit, func(rest string, b []byte) error {
		kind, entity, ok := strings.Cut(rest, ".")
		if !ok {
			return nil
		}
		st, err := outbox.Decode[consentState](b)
		if err != nil {
			return err
		}
		out = append(out, ConsentRecord{EntityKind: schema.ConsentEntityKind(kind), Entity: entity, State: st.State})
		return nil
	})
	return out, next, err
}

// ListIdentities returns up to limit of the association states a client
// holds, as ListConsent.
func (s *Store) ListIdentities(ctx context.Context, tenant, clientID string, from uint64, limit int) ([]HeldIdentity, uint64, error) {
	var out []HeldIdentity
	next, err := s.list(ctx, tenant, clientID, "identity", from, limit, func(inbox string, b []byte) error {
		st, err := outbox.Decode[AssociationState](b)
		if err != nil {
			return err
		}
		out = append(out, HeldIdentity{InboxID: inbox, Held: st})
		return nil
	})
	return out, next, err
}

// Identity returns the association state a client holds for an inbox.
func (s *Store) Identity(ctx context.Context, tenant, clientID, inbox string) (AssociationState, bool, error) {
	key, err := identityKey(tenant, clientID, inbox)
	if err != nil {
		return AssociationState{}, false, err
	}
	return outbox.Get[AssociationState](ctx, s.out, key)
}

// Consent returns a client's consent state of an entity; unknown when
// none is stored.
func (s *Store) Consent(ctx context.Context, tenant, clientID string, kind schema.ConsentEntityKind, entity string) (schema.ConsentState, error) {
	key, err := consentKey(tenant, clientID, kind, entity)
	if err != nil {
		return "", err
	}
	st, found, err := outbox.Get[consentState](ctx, s.out, key)
	if err != nil || !found {
		return schema.ConsentUnknown, err
	}
	return st.State, nil
}

// list scans the keys <tenant>.<client>.<kind>.… of fabric-stores from
// sequence from, handing each one's rest of key and value to add.
func (s *Store) list(ctx context.Context, tenant, clientID, kind string, from uint64, limit int, add func(rest string, b []byte) error) (uint64, error) {
	prefix, err := subject.Key(tenant, clientID, kind)
	if err != nil {
		return 0, err
	}
	got, err := readmodel.ScanKV(ctx, s.js, streams.BucketStores, prefix, from, limit)
	if err != nil {
		return 0, fmt.Errorf("clientstore: list %s: %w", kind, err)
	}
	next, err := page(got, limit, add)
	if err != nil {
		return 0, fmt.Errorf("clientstore: list %s: %w", kind, err)
	}
	return next, nil
}

// page hands each live entry of a scan of up to limit to add and returns
// the sequence the next page starts at, 0 when the scan reached the end.
func page(got []readmodel.Stored, limit int, add func(subject string, b []byte) error) (uint64, error) {
	var next uint64
	for _, m := range got {
		next = m.Seq + 1
		if len(m.Data) == 0 {
			continue // a deleted key
		}
		if err := add(m.Subject, m.Data); err != nil {
			return 0, err
		}
	}
	if len(got) < limit || got[len(got)-1].Pending == 0 {
		next = 0
	}
	return next, nil
}

// ListClients returns up to limit of a tenant's hosted clients, in the order
// their records were last written, from fabric-clients sequence from on,
// and the sequence the next page starts at (0 when there is no more). Only
// the records are read (<tenant>.<client>), not the bucket's indexes or
// the tenant's entries such as its content key; a
// client whose record is rewritten while an operator pages can show twice.
func (s *Store) ListClients(ctx context.Context, tenant string, from uint64, limit int) ([]Record, uint64, error) {
	if err := subject.ValidTenant(tenant); err != nil {
		return nil, 0, err
	}
	got, err := readmodel.Scan(ctx, s.js, streams.KVStream(streams.BucketClients), streams.KVSubject(streams.BucketClients, tenant+".*"), from, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("clientstore: list clients: %w", err)
	}
	var out []Record
	next, err := page(got, limit, func(key string, b []byte) error {
		if subject.ValidClient(key[strings.LastIndexByte(key, '.')+1:]) != nil {
			return nil // a tenant-level entry (the content key), not a client
		}
		rec, err := DecodeRecord(b)
		if err == nil {
			out = append(out, rec)
		}
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("clientstore: list clients: %w", err)
	}
	return out, next, nil
}
