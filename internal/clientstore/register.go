package clientstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/internal/clientstore/outbox"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/httpapi"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Bounds of one request for KeyPackages.
const (
	DefaultKeyPackages = 1
	MaxKeyPackages     = 100
	// maxCredentialHandle bounds a credential handle's length.
	maxCredentialHandle = 256
)

// RegisterRequest is the body of POST /v1/tenants/{tenant}/clients.
type RegisterRequest struct {
	// InboxID is the lowercase hex of the 32-byte account id.
	InboxID string `json:"inbox_id" msgpack:"inbox_id"`
	// KeyPackages is how many fresh KeyPackages to hand out:
	// DefaultKeyPackages when absent, at most MaxKeyPackages. With Import
	// it counts KeyPackages beyond the imported one, and defaults to 0.
	KeyPackages *int `json:"key_packages,omitempty" msgpack:"key_packages,omitempty"`
	// CredentialHandle names the credential the client shares with other
	// clients for lockout (EVENT-055); the client's own id when absent.
	CredentialHandle string `json:"credential_handle,omitempty" msgpack:"credential_handle,omitempty"`
	// Import, when present, is existing key material to host instead of a
	// generated installation.
	Import *ImportMaterial `json:"import,omitempty" msgpack:"import,omitempty"`
}

// ImportMaterial is an existing installation's key material: a KeyPackage
// (MLSMessage) and its private keys, in the RFC 9420 test-vector forms.
type ImportMaterial struct {
	KeyPackage           schema.Bytes `json:"key_package" msgpack:"key_package"`
	SignaturePrivateKey  schema.Bytes `json:"signature_private_key" msgpack:"signature_private_key"`
	EncryptionPrivateKey schema.Bytes `json:"encryption_private_key" msgpack:"encryption_private_key"`
	InitPrivateKey       schema.Bytes `json:"init_private_key" msgpack:"init_private_key"`
}

// ClientInfo is the public view of a hosted client: the answer to
// registration and to GET …/clients/{client_id}.
type ClientInfo struct {
	ClientID         string       `json:"client_id" msgpack:"client_id"`
	InboxID          string       `json:"inbox_id" msgpack:"inbox_id"`
	InstallationKey  schema.Bytes `json:"installation_key" msgpack:"installation_key"`
	CredentialHandle string       `json:"credential_handle" msgpack:"credential_handle"`
	CreatedAt        time.Time    `json:"created_at" msgpack:"created_at"`
	// KeyPackages are the KeyPackage MLSMessages handed out by this answer;
	// absent from GET.
	KeyPackages []schema.Bytes `json:"key_packages,omitempty" msgpack:"key_packages,omitempty"`
}

// KeyPackagesRequest is the body of POST …/clients/{client_id}/key-packages.
type KeyPackagesRequest struct {
	Count int `json:"count" msgpack:"count"`
}

// KeyPackagesAnswer carries fresh KeyPackage MLSMessages.
type KeyPackagesAnswer struct {
	KeyPackages []schema.Bytes `json:"key_packages" msgpack:"key_packages"`
}

func info(rec Record, kps [][]byte) ClientInfo {
	ci := ClientInfo{
		ClientID:         rec.ClientID,
		InboxID:          rec.InboxID,
		InstallationKey:  rec.InstallationKey,
		CredentialHandle: rec.CredentialHandle,
		CreatedAt:        rec.CreatedAt,
	}
	for _, kp := range kps {
		ci.KeyPackages = append(ci.KeyPackages, kp)
	}
	return ci
}

func (s *Store) register(r *http.Request, c call) (int, any, error) {
	var req RegisterRequest
	if err := httpapi.Decode(r, maxBody, &req); err != nil {
		return 0, nil, err
	}
	rec, kps, err := s.RegisterClient(r.Context(), c.tenant, req)
	if errors.Is(err, outbox.ErrEmit) {
		// The client exists; its identity.registered follows with the next
		// request about it.
		s.log.Warn("register: identity.registered not emitted yet", "err", err)
		err = nil
	}
	if err != nil {
		return 0, nil, emitError(err)
	}
	return http.StatusCreated, info(rec, kps), nil
}

// RegisterClient creates (or imports) a hosted client of tenant, stores it with
// the index of its KeyPackages, and emits identity.registered with the own
// inbox and the installation key. It returns the record and the KeyPackage
// MLSMessages handed out. Errors a caller caused are refusals; with
// outbox.ErrEmit the client is registered and its event follows.
func (s *Store) RegisterClient(ctx context.Context, tenant string, req RegisterRequest) (Record, [][]byte, error) {
	if !isInboxID(req.InboxID) {
		return Record{}, nil, refusal.BadRequest("inbox_id: want %d lowercase hex digits", inboxIDLen)
	}
	if len(req.CredentialHandle) > maxCredentialHandle {
		return Record{}, nil, refusal.BadRequest("credential_handle: longer than %d bytes", maxCredentialHandle)
	}
	n := DefaultKeyPackages
	if req.Import != nil {
		n = 0
	}
	if req.KeyPackages != nil {
		n = *req.KeyPackages
	}
	if n < 0 || n > MaxKeyPackages {
		return Record{}, nil, refusal.BadRequest("key_packages: want 0 to %d", MaxKeyPackages)
	}
	account, _ := hex.DecodeString(req.InboxID)
	inst, err := s.installation(account, req.Import)
	if err != nil {
		return Record{}, nil, err
	}
	var kps [][]byte
	if req.Import != nil {
		kps = append(kps, req.Import.KeyPackage)
	}
	fresh, err := inst.NewKeyPackages(n)
	if err != nil {
		return Record{}, nil, fmt.Errorf("clientstore: register: %w", err)
	}
	kps = append(kps, fresh...)
	if len(kps) == 0 {
		return Record{}, nil, refusal.BadRequest("key_packages: a client needs at least one KeyPackage")
	}
	sealed, err := s.vault.Seal(inst)
	if err != nil {
		return Record{}, nil, fmt.Errorf("clientstore: seal installation: %w", err)
	}
	rec := Record{
		Tenant:           tenant,
		ClientID:         inst.ClientID(),
		InboxID:          req.InboxID,
		InstallationKey:  inst.InstallationKey(),
		CredentialHandle: req.CredentialHandle,
		Installation:     sealed,
		CreatedAt:        s.clock.Now().UTC(),
	}
	if rec.CredentialHandle == "" {
		rec.CredentialHandle = rec.ClientID
	}
	// Indexes first, the record last: a client exists once its record does,
	// and by then every way to reach it works.
	if err := s.indexKeyPackages(ctx, tenant, rec.ClientID, kps); err != nil {
		return Record{}, nil, err
	}
	ckey, err := credentialKey(tenant, rec.CredentialHandle, rec.ClientID)
	if err != nil {
		return Record{}, nil, fmt.Errorf("clientstore: register: %w", err)
	}
	if _, err := s.clients.Put(ctx, ckey, nil); err != nil {
		return Record{}, nil, fmt.Errorf("clientstore: index credential: %w", err)
	}
	key, err := recordKey(tenant, rec.ClientID)
	if err != nil {
		return Record{}, nil, fmt.Errorf("clientstore: register: %w", err)
	}
	b, err := msgpack.Marshal(rec)
	if err != nil {
		return Record{}, nil, fmt.Errorf("clientstore: encode record: %w", err)
	}
	if _, err := s.clients.Create(ctx, key, b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return Record{}, nil, ErrClientExists
		}
		return Record{}, nil, fmt.Errorf("clientstore: store record: %w", err)
	}
	if err := s.registered(ctx, rec); err != nil {
		return rec, kps, err
	}
	return rec, kps, nil
}

// installation generates an installation for account, or imports one.
func (s *Store) installation(account []byte, imp *ImportMaterial) (*engine.Installation, error) {
	if imp == nil {
		inst, err := engine.CreateInstallation(account, engine.DefaultCipherSuite)
		if err != nil {
			return nil, fmt.Errorf("clientstore: create installation: %w", err)
		}
		return inst, nil
	}
	inst, err := engine.ImportInstallation(imp.KeyPackage, imp.SignaturePrivateKey, imp.EncryptionPrivateKey, imp.InitPrivateKey)
	if err != nil {
		return nil, refusal.BadRequest("import: the key material does not form an installation")
	}
	if string(inst.AccountID()) != string(account) {
		return nil, refusal.BadRequest("import: the KeyPackage's credential is not this inbox_id")
	}
	if len(inst.InstallationKey()) != schema.InstallationKeySize {
		return nil, refusal.BadRequest("import: the cipher suite's installation key is not %d bytes", schema.InstallationKeySize)
	}
	return inst, nil
}

// indexKeyPackages records <tenant>.kp.<ref> → client for each KeyPackage.
func (s *Store) indexKeyPackages(ctx context.Context, tenant, clientID string, kps [][]byte) error {
	return indexKeyPackages(ctx, s.clients, tenant, clientID, kps)
}

func indexKeyPackages(ctx context.Context, kv jetstream.KeyValue, tenant, clientID string, kps [][]byte) error {
	for _, kp := range kps {
		ref, err := engine.KeyPackageRef(kp)
		if err != nil {
			return fmt.Errorf("clientstore: key package ref: %w", err)
		}
		key, err := keyPackageKey(tenant, hex.EncodeToString(ref))
		if err != nil {
			return fmt.Errorf("clientstore: key package key: %w", err)
		}
		if _, err := kv.Put(ctx, key, []byte(clientID)); err != nil {
			return fmt.Errorf("clientstore: index key package: %w", err)
		}
	}
	return nil
}

// registered records the registration in the client's own store record and
// emits identity.registered. The record also holds the client's HMAC state:
// the epoch it opened in, from which EVENT-026 counts.
func (s *Store) registered(ctx context.Context, rec Record) error {
	key, err := clientStateKey(rec.Tenant, rec.ClientID)
	if err != nil {
		return err
	}
	epoch := s.epoch(s.clock.Now())
	_, _, err = outbox.Apply(ctx, s.out, key, func(cur clientState, found bool) (outbox.Change[clientState], error) {
		if found {
			return outbox.Change[clientState]{State: cur}, nil
		}
		ev := outbox.Event{
			Tenant:   rec.Tenant,
			ClientID: rec.ClientID,
			ID:       eventID(rec.Tenant, rec.ClientID, "registered"),
			Event: schema.ClientEvent{
				Kind: schema.KindIdentityRegistered,
				IdentityRegistered: &schema.IdentityRegistered{
					InboxID:         rec.InboxID,
					InstallationKey: rec.InstallationKey,
				},
			},
		}
		return outbox.Change[clientState]{State: clientState{Epoch: epoch}, Store: true, Events: []outbox.Event{ev}}, nil
	})
	return err
}

// ClientsPage is the answer of GET /v1/tenants/{tenant}/clients: a page of
// the tenant's hosted clients, the console's list to choose one from.
type ClientsPage struct {
	Clients    []ClientInfo `json:"clients" msgpack:"clients"`
	NextCursor string       `json:"next_cursor,omitempty" msgpack:"next_cursor,omitempty"`
}

// Pages of the client list.
const (
	DefaultClientsLimit = 50
	MaxClientsLimit     = 500
)

func (s *Store) listClients(r *http.Request, c call) (int, any, error) {
	p, err := httpapi.PageOf(r, DefaultClientsLimit, MaxClientsLimit)
	if err != nil {
		return 0, nil, err
	}
	recs, next, err := s.ListClients(r.Context(), c.tenant, p.Cursor, p.Limit)
	if err != nil {
		return 0, nil, err
	}
	out := ClientsPage{Clients: []ClientInfo{}, NextCursor: httpapi.Cursor(next)}
	for _, rec := range recs {
		out.Clients = append(out.Clients, info(rec, nil))
	}
	return http.StatusOK, out, nil
}

func (s *Store) getClient(r *http.Request, c call) (int, any, error) {
	return http.StatusOK, info(*c.client, nil), nil
}

func (s *Store) keyPackages(r *http.Request, c call) (int, any, error) {
	var req KeyPackagesRequest
	if err := httpapi.Decode(r, maxBody, &req); err != nil {
		return 0, nil, err
	}
	if req.Count < 1 || req.Count > MaxKeyPackages {
		return 0, nil, refusal.BadRequest("count: want 1 to %d", MaxKeyPackages)
	}
	kps, err := s.FreshKeyPackages(r.Context(), c.tenant, c.client.ClientID, req.Count)
	if err != nil {
		return 0, nil, err
	}
	ans := KeyPackagesAnswer{KeyPackages: make([]schema.Bytes, len(kps))}
	for i, kp := range kps {
		ans.KeyPackages[i] = kp
	}
	return http.StatusOK, ans, nil
}

// listKeyPackages answers GET …/key-packages: the client's pool, every
// KeyPackage it holds that no join has consumed, in KeyPackageRef order.
func (s *Store) listKeyPackages(_ *http.Request, c call) (int, any, error) {
	inst, err := s.vault.Open(c.client.Installation)
	if err != nil {
		return 0, nil, fmt.Errorf("clientstore: open installation: %w", err)
	}
	ans := KeyPackagesAnswer{KeyPackages: []schema.Bytes{}}
	for _, ref := range inst.KeyPackageRefs() {
		kp, _ := inst.KeyPackageMessage(ref)
		ans.KeyPackages = append(ans.KeyPackages, kp)
	}
	return http.StatusOK, ans, nil
}

// FreshKeyPackages generates n KeyPackages for a client, indexes them and
// stores their private keys in the client's sealed installation, then
// returns their MLSMessages. A concurrent change of the record (converge
// consuming a KeyPackage) makes it start over.
func (s *Store) FreshKeyPackages(ctx context.Context, tenant, clientID string, n int) ([][]byte, error) {
	key, err := recordKey(tenant, clientID)
	if err != nil {
		return nil, fmt.Errorf("clientstore: key packages: %w", err)
	}
	for range maxRecordAttempts {
		e, err := s.clients.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, ErrNotFound
		}
		if err != nil {
			return nil, fmt.Errorf("clientstore: key packages: %w", err)
		}
		rec, err := DecodeRecord(e.Value())
		if err != nil {
			return nil, err
		}
		inst, err := s.vault.Open(rec.Installation)
		if err != nil {
			return nil, fmt.Errorf("clientstore: open installation: %w", err)
		}
		kps, err := inst.NewKeyPackages(n)
		if err != nil {
			return nil, fmt.Errorf("clientstore: key packages: %w", err)
		}
		if rec.Installation, err = s.vault.Seal(inst); err != nil {
			return nil, fmt.Errorf("clientstore: seal installation: %w", err)
		}
		if err := s.indexKeyPackages(ctx, tenant, clientID, kps); err != nil {
			return nil, err
		}
		b, err := msgpack.Marshal(rec)
		if err != nil {
			return nil, fmt.Errorf("clientstore: encode record: %w", err)
		}
		_, err = s.clients.Update(ctx, key, b, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("clientstore: store record: %w", err)
		}
		return kps, nil
	}
	return nil, outbox.ErrContention
}

// maxRecordAttempts bounds the compare-and-set retries on a client record.
const maxRecordAttempts = 16
